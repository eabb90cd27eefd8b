"""Checks on what the user passed, made before any work starts: each mistake is one line and exit 2.

The verifier trusts its arguments; a command that hands it zero seeds, a shape set the task lacks or a
binary file would get a meaningless verdict (or a traceback) back, so the commands check here first.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from ..providers.registry import registered
from ..tasks.model import Task
from .core import UserError

if TYPE_CHECKING:
    from ..verifier.plan import Plan

MODEL_ENV = "CODA_AGENT_MODEL"
#: Every way to write a --model, from the provider registry.
MODEL_SPECS = ", ".join(e.usage for e in registered()[:-1]) + f" or {registered()[-1].usage}"
NO_MODEL = f"no model: pass --model {MODEL_SPECS} (or set {MODEL_ENV})"
MODEL_HELP = f"{escape(MODEL_SPECS)} (see `coda-agent providers`); repeat for a sweep over models"

def note_skipped(skipped: list[str]) -> None:
    """One line on stderr for each YAML file of a folder that is no task file (every command skips them
    alike)."""
    from .core import err_console, untrusted

    for why in skipped:
        err_console.print(f"[bold yellow]skipped:[/] {untrusted(why)}", highlight=False)


#: The shape set the CPU emulator runs: real sizes on a CPU take hours and prove nothing the small ones don't.
EMULATOR_SHAPES = "small"

#: Per stage: (fixed seconds, seconds per shape point and seed) of a verification's default time limit, about
#: ten times what a correct kernel needs, so only a hung or looping candidate ever reaches it.
STAGE_SECONDS = {
    "correctness": (30.0, 10.0),  # the emulator at the small shapes on a CPU
    "compile": (180.0, 0.0),  # every kernel built for sm_90a on a CPU
    "gpu_correctness": (180.0, 20.0),  # one QuACK build per bench shape, then the checks
    # the timings, and torch.compile of the reference at each shape (cached after once)
    "profile": (60.0, 10.0),
    "bench": (60.0, 5.0),
}
START_UP_SECONDS = 30.0  # the worker process importing torch and the primitives


def example_places(paths: list[Path]) -> list[str]:
    """The ``--examples-from`` places as absolute paths (a sweep or a resumed run finds them from anywhere):
    each a task file or a folder of tasks that exists."""
    for p in paths:
        if not p.exists():
            raise UserError(f"--examples-from {p}: no such file or folder")
        if p.is_file() and p.suffix not in (".yaml", ".yml"):
            raise UserError(f"--examples-from {p}: not a task file or folder (a task's human kernel is found "
                            "from its YAML)")
    return [str(p.resolve()) for p in paths]


def seed_list(n: int) -> list[int]:
    """Seeds ``0..n-1``; zero or fewer would check nothing and report a pass."""
    if n < 1:
        raise UserError(f"--seeds {n}: must be at least 1 (with no seeds nothing is checked)")
    return list(range(n))


def check_shape_set(task: Task, plan: Plan) -> None:
    """The task has the plan's shape set, and the CPU emulator is not asked for real sizes."""
    shape_set = plan.shape_set
    if shape_set not in task.shapes:
        raise UserError(f"task {task.name} has no shape set {shape_set!r} (has: {', '.join(task.shapes)})")
    if plan.backend == "torch" and shape_set != EMULATOR_SHAPES:
        raise UserError(
            f"--shapes {shape_set}: the CPU emulator runs the {EMULATOR_SHAPES!r} shapes only (real sizes "
            "would run for hours on a CPU); use --backend quack on a GPU for the bench shapes"
        )


def default_timeout(task: Task, plan: Plan) -> float:
    """Seconds one ``verify()`` call may take: worker start-up plus each stage's share (see STAGE_SECONDS)."""
    checks = len(plan.points(task)) * len(plan.seeds)
    total = START_UP_SECONDS
    for stage in plan.stages:
        fixed, per_check = STAGE_SECONDS.get(stage, (60.0, 10.0))
        total += fixed + per_check * checks
    return total


def timeout_value(given: float | None, default: float) -> float:
    if given is None:
        return default
    if given <= 0:
        raise UserError(f"--timeout {given:g}: must be a positive number of seconds")
    return given


def read_candidate(path: Path) -> str:
    """A candidate's source text, or one line saying why the file cannot be one."""
    if path.is_dir():
        raise UserError(f"{path}: a folder, not a candidate file (pass the .py file)")
    try:
        return path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: no such candidate file") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (a candidate is Python source)") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None


def check_task_runs(task: Task) -> None:
    """The task's reference imports and runs on the small shapes (CPU): a broken task stops here, not per
    attempt."""
    from ..tasks.validate import validate_task

    problems = validate_task(task)
    if len(problems) == 1:
        raise UserError(f"task {task.name} is not usable: {problems[0]}")
    if problems:
        raise UserError(f"task {task.name} is not usable ({len(problems)} problems; `coda-agent validate "
                        f"{task.path}`):\n"
                        + "\n".join(f"  - {p}" for p in problems))


def check_fits_device(task: Task, plan: Plan) -> None:
    """A verification whose estimated peak memory (checker and runner, at every shape) exceeds the GPU's free
    memory stops here, in one line with the numbers (``verifier.plan.memory_need``); nothing to check without
    a GPU stage."""
    from ..verifier.plan import device_memory_refusal

    refusal = device_memory_refusal(task, plan)
    if refusal:
        raise UserError(refusal)
