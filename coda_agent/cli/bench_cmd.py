"""``coda-agent bench``: the human kernels against eager, torch.compile, cuBLAS and the speed of light."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..atomic import write_text_atomic
from ..bench.results import E2E_SUFFIX, BenchRun
from ..settings import bench_dir
from ..tasks.loader import find_task, load_tasks
from ..tasks.model import Task
from ..untrusted import shown
from ..verifier.plan import DEFAULT_TUNE_BUDGET_S
from .core import UserError, app, console, refuse_without_runners, untrusted, wide_console

if TYPE_CHECKING:
    from ..bench.runner import BenchOptions

NO_GPU = (
    "no CUDA GPU on this machine: `coda-agent bench` times real kernels on an H200; "
    "to check a kernel's algebra on the CPU emulator, run `coda-agent verify TASK --backend torch`"
)


def select_tasks(names: list[str] | None, shape_set: str, shape_names: list[str] | None) -> list[Task]:
    """The tasks to bench (default: every task with a human kernel), narrowed to those with the shapes asked
    for."""
    tasks = [find_task(n) for n in names] if names else [t for t in load_tasks() if t.human_file is not None]
    for t in tasks:
        if t.human_file is None or not t.human_file.exists():
            raise UserError(f"task {t.name} has no human kernel to bench")
        if shape_set not in t.shapes:
            raise UserError(f"task {t.name} has no shape set {shape_set!r} (has: {', '.join(t.shapes)})")
    if shape_names:
        known = {p.name for t in tasks for p in t.shape(shape_set)}
        unknown = sorted(set(shape_names) - known)
        if unknown:
            raise UserError(f"no selected task has {shape_set} shape(s) {', '.join(unknown)} (known: "
                            f"{', '.join(sorted(known))})")
        tasks = [t for t in tasks if any(p.name in shape_names for p in t.shape(shape_set))]
    if not tasks:
        raise UserError("no tasks to bench")
    return tasks


def default_paths(device: str, suffix: str = "") -> tuple[Path, Path]:
    """``<bench dir>/<device>-<date><suffix>.json`` and ``.md``."""
    from ..bench.runner import device_slug

    results = bench_dir()  # where the leaderboard reads them
    base = results / f"{device_slug(device)}-{date.today().isoformat()}{suffix}"
    return base.with_suffix(".json"), base.with_suffix(".md")


@app.command("bench")
def bench_cmd(
    tasks: list[str] = typer.Argument(
        None, help="task names or YAML paths (default: every task with a human kernel)", metavar="TASK"
    ),
    shapes: str = typer.Option("bench", "--shapes", help="shape set to run"),
    shape: list[str] = typer.Option(None, "--shape", help="only this shape point (repeatable)",
                                    metavar="<name>"),
    seeds: int = typer.Option(3, min=1, help="correctness seeds per shape"),
    jobs: int = typer.Option(4, min=1,
                             help="correctness checks at once on each GPU (kernel builds are CPU-bound)"),
    executor: str = typer.Option("local", "--executor",
                                 help="where verifications run: local (this host's GPUs) or ray"),
    address: str = typer.Option(None, "--address",
                                help="with --executor ray: the cluster (HOST:PORT, ray://HOST:PORT or auto; "
                                "default: a private one on this host)"),
    json_out: Path = typer.Option(
        None, "--json",
        help="results JSON (default: $CODA_AGENT_BENCH_DIR or ./bench/results, <device>-<date>.json)"
    ),
    md_out: Path = typer.Option(None, "--md", help="markdown summary (default: next to the JSON)"),
    save: bool = typer.Option(True, "--save/--no-save", help="write the JSON and markdown files"),
    tune: bool = typer.Option(False, "--tune",
                              help="search the human kernels' gemm configs (the verifier's tune stage) "
                              "and print the @schedule to pin, as a diff"),
    tune_budget: float = typer.Option(DEFAULT_TUNE_BUDGET_S, "--tune-budget", min=1,
                                      help="with --tune: seconds of tuning per kernel (its tune stage's wall "
                                      "time)"),
    max_autotune: bool = typer.Option(
        True, "--max-autotune/--no-max-autotune",
        help="also time torch.compile mode max-autotune-no-cudagraphs (minutes of Inductor autotuning per "
        "shape)",
    ),
    resume: bool = typer.Option(
        False, "--resume",
        help="keep the tasks the results file already finished (same device, commit and seeds)"
    ),
) -> None:
    """Time each human kernel against eager PyTorch, torch.compile, cuBLAS alone and the speed of light."""
    selected = select_tasks(tasks, shapes, shape)
    import torch

    if not torch.cuda.is_available():  # a setup error like any other: one line, exit 2
        raise UserError(NO_GPU)
    refuse_without_runners()
    device = torch.cuda.get_device_name(0)
    if tune:
        _tune(selected, shapes, shape, tune_budget, json_out if save else None, device)
        return
    from ..bench.report import target_checks, task_table
    from ..bench.runner import BenchOptions, command_line, run_bench, write_run
    from ..execute import ExecutorError, open_executor
    from ..measure.baselines import COMPILE_MODES
    from ..measure.peaks import measure_peaks

    modes = tuple(COMPILE_MODES) if max_autotune else ("default",)
    opts = BenchOptions(shape_set=shapes, shape_names=shape or None, seeds=seeds, compile_modes=modes)
    json_path, md_path = default_paths(device)
    json_path = json_out or json_path
    md_path = md_out or (json_path.with_suffix(".md") if json_out else md_path)

    previous = _previous_run(json_path, device, opts) if resume else None

    def checkpoint(partial: BenchRun) -> None:
        if save:
            write_run(partial, json_path, md_path)

    try:
        workers = open_executor(executor, address=address, cpu_workers=jobs, gpu_slots=jobs)
    except ExecutorError as exc:
        raise UserError(str(exc)) from None
    console.print(f"verifying on {workers.describe()}", highlight=False, markup=False)
    with workers, _progress(1 + 2 * len(selected), workers.activity) as step:
        peaks = measure_peaks()
        step(f"peaks {peaks.tflops_bf16:.0f} TFLOP/s, {peaks.hbm_tbps:.2f} TB/s")
        run = run_bench(selected, opts, peaks, device, command_line(), step, checkpoint, previous,
                        executor=workers)
    console.print(f"{device}: measured {peaks.tflops_bf16:.0f} TFLOP/s bf16, {peaks.hbm_tbps:.2f} TB/s "
                  f"({peaks.how})")
    from ..bench.report import by_task

    for name, rows in by_task(run.rows).items():
        wide_console().print(task_table(name, rows))
    checks = target_checks(run)
    if checks:
        met = sum(c.met for c in checks)
        untimed = len(run.rows) - len(checks)
        console.print(f"targets: {met}/{len(checks)} rows met"
                      + (f", {untimed} not timed yet" if untimed else ""))
        for c in checks:
            if not c.met:
                console.print(f"  [yellow]missed[/] {c.describe()}", highlight=False)
    for r in run.rows:
        if not r.correct:
            console.print(f"[red]FAILED[/] {untrusted(r.task)} @ {untrusted(r.shape)}: "
                          f"{untrusted(r.verdict_reason)}", highlight=False)
    if save:
        for p in write_run(run, json_path, md_path):
            console.print(f"wrote {p}")
    if not all(r.correct for r in run.rows):
        raise typer.Exit(1)


def _previous_run(path: Path, device: str, opts: BenchOptions) -> BenchRun | None:
    """The results file ``--resume`` continues, or None when there is none yet."""
    from ..bench.runner import resume_problem

    if not path.exists():
        console.print(f"no {path} yet: nothing to resume, measuring every task")
        return None
    try:
        previous = BenchRun.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(
            f"cannot resume from {path}: not a bench results file ({str(exc).splitlines()[0]})"
        ) from None
    problem = resume_problem(previous, device, opts)
    if problem:
        raise UserError(f"cannot resume from {path}: {problem}; pass another --json or drop --resume")
    return previous


@contextmanager
def _progress(total: int, activity: Callable[[], str] = str) -> Iterator[Callable[[str], None]]:
    """A live bar (and what each worker runs) on a terminal; on a pipe or a file, one line per step with the
    seconds since the start."""
    if console.is_terminal:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as bar:
            job = bar.add_task("measuring peaks", total=total)
            busy = bar.add_task("", total=None)

            def step(msg: str) -> None:  # a step's line may quote a kernel's exception: text, not markup
                bar.update(job, advance=1, description=untrusted(msg))
                bar.update(busy, description=f"  {activity()}")

            yield step
        return
    t0 = time.monotonic()
    lock = threading.Lock()  # the check phase reports from several threads

    def line(msg: str) -> None:
        with lock:
            print(f"[{time.monotonic() - t0:7.1f} s] {shown(msg)}", flush=True)

    line("measuring peaks")
    yield line


def _tune(selected: list[Task], shapes: str, shape: list[str] | None, budget_s: float, json_out: Path | None,
          device: str) -> None:
    from ..bench.runner import command_line
    from ..bench.tune import SEARCH_COLUMNS, failures, search_rows, tune_human_kernel
    from ..provenance import driver_version, git_commit, package_versions
    from ..verifier.builds import build_line

    tuned: dict[str, dict[str, object]] = {}
    # what every recorded figure names beside itself (no "rows": the store skips it, results.holds_no_rows)
    report: dict[str, object] = {
        "date": date.today().isoformat(), "budget_s": budget_s, "device": device, "driver": driver_version(),
        "commit": git_commit(), "packages": package_versions(), "command": command_line(), "tasks": tuned,
    }
    for task in selected:
        console.print(f"tuning [bold]{task.name}[/] (the verifier's tune stage, up to {budget_s:.0f} s)")
        result = tune_human_kernel(task, shapes, shape or None, budget_s)
        searched = result.tuned
        if result.failed:
            console.print(f"[red]{untrusted(task.name)}: the search failed: {untrusted(result.failed)}[/]")
        rows = search_rows(searched)
        if rows:
            table = Table(title=f"{task.name}: the tuned schedule against the configs as written",
                          title_justify="left")
            for col in SEARCH_COLUMNS:
                table.add_column(col)
            for row in rows:
                table.add_row(*row)
            wide_console().print(table)
        for line in failures(searched):
            console.print(f"  failed: {untrusted(line)}", highlight=False)
        if searched.builds:
            console.print(build_line(searched.builds), highlight=False)
        for shape_name, why in searched.lost.items():
            console.print(f"[yellow]{untrusted(shape_name)}: not tuned: {untrusted(why)}[/]")
        diff = result.diff()
        if not result.failed:
            console.print(diff or "(nothing beat the configs as written by 1% or more)", highlight=False,
                          markup=False)
        tuned[task.name] = {
            "failed": result.failed, "diff": diff,
            "shapes": {k: v.model_dump(mode="json") for k, v in searched.search.items()},
            "lost": searched.lost,
            "cut_short": {k: [c.model_dump(mode="json") for c in calls]
                          for k, calls in searched.cut_short.items()},
            "builds": searched.builds,
        }
        if json_out:  # after every task: a long sweep keeps what it finished
            write_text_atomic(json_out, json.dumps(report, indent=2) + "\n")
    if json_out:
        console.print(f"wrote {json_out}")
    if any(t["failed"] for t in tuned.values()):
        raise typer.Exit(1)


NO_GPU_E2E = (
    "no CUDA GPU on this machine: `coda-agent bench-e2e` times a Llama-3 stack's training step on an H200; "
    "`--preset tiny` runs it on the CPU emulator, to check a --kernel file's gradients in the stack (its "
    "times mean nothing)"
)


def chosen_kernel_files(specs: list[str]) -> dict[str, Path]:
    """``--kernel TASK=FILE`` options as {task: file}, each file imported once here so that a wrong one is
    one line before any GPU work."""
    from ..torch import CHAIN_TASKS, Kernels

    files: dict[str, Path] = {}
    for spec in specs:
        task, sep, file = spec.partition("=")
        if not sep or not task or not file:
            raise UserError(f"--kernel takes TASK=FILE, got {spec!r}")
        if task not in CHAIN_TASKS:
            raise UserError(f"--kernel: {task} is not a task of the Llama-3 chain (it runs "
                            f"{', '.join(CHAIN_TASKS)})")
        if task in files:
            raise UserError(f"--kernel: {task} is given twice")
        path = Path(file)
        if not path.is_file():
            raise UserError(f"--kernel: no file {file}")
        files[task] = path
    try:
        Kernels(files)
    except Exception as exc:  # the user's file, whatever it raises: one line
        raise UserError(f"--kernel: {type(exc).__name__}: {exc}") from None
    return files


@app.command("bench-e2e")
def bench_e2e_cmd(
    preset: str = typer.Option("1b", "--preset", help="model and batch: 1b (CODA's torchtitan 1B, batch 4 x "
                                                      "8192), 8b (Llama 3.1 8B's layers, "
                                "batch 2 x 8192) or tiny"),
    layers: int = typer.Option(None, "--layers", min=1,
                               help="decoder layers (default: the preset's; 1b has 16)"),
    batch: int = typer.Option(None, "--batch", min=1, help="sequences per step (default: the preset's)"),
    seq: int = typer.Option(None, "--seq", min=1, help="tokens per sequence (default: the preset's)"),
    variant: list[str] = typer.Option(
        None, "--variant",
        help="variants to time beside coda (repeatable; default: eager, compile; also compile-max-autotune "
        "(Inductor's max-autotune-no-cudagraphs, for logits under 2^31 values); compile-max-autotune-cublas "
        "(that mode with its GEMMs on cuBLAS, at any size); coda-compile; coda-kmajor: "
        "CODA with K-major weight copies for its dgrad GEMMs; coda-own-head: CODA with the chain's own LM "
        "head (logits kept, the cross-entropy tasks' kernels) in place of QuACK's scaled-exp one in 4096-row "
        "chunks; coda-scaled-exp-16k: that one in 16384-row chunks)",
        metavar="<name>"),
    kernel: list[str] = typer.Option(
        None, "--kernel",
        help="TASK=FILE: a kernel file (say, a run's best.py) for one of the chain's tasks (repeatable); "
        "adds the coda-kernels variant, CODA with these files in place of their tasks' human kernels. The "
        "files run in this process, unsandboxed: only files you trust", metavar="TASK=FILE"),
    steps: int = typer.Option(20, "--steps", min=3, help="timed steps per variant"),
    warmup: int = typer.Option(3, "--warmup", min=1,
                               help="untimed steps per variant first (the compiles happen here)"),
    top: int = typer.Option(15, "--top", min=1, help="kernels listed per variant"),
    json_out: Path = typer.Option(None, "--json",
                                  help="results JSON (default: the bench dir, <device>-<date>-e2e.json)"),
    md_out: Path = typer.Option(None, "--md", help="markdown summary (default: next to the JSON)"),
    save: bool = typer.Option(True, "--save/--no-save", help="write the JSON and markdown files"),
    gradients: bool = typer.Option(True, "--gradients/--no-gradients",
                                   help="check each eager CODA variant's gradients at one short sequence "
                                   "against FP32 autograd (the suite's tolerance rule); exit 1 if any fails"),
) -> None:
    """Time a Llama-3 layer stack's forward+backward on the task kernels against eager and torch.compile."""
    from ..bench.e2e import CUT_SHORT, DEFAULT_VARIANTS, PRESETS, VARIANTS, run_e2e, step_plan

    if preset not in PRESETS:
        raise UserError(f"no preset {preset!r} (known: {', '.join(PRESETS)})")
    unknown = sorted(set(variant or ()) - set(VARIANTS))
    if unknown:
        raise UserError(f"no variant {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    kernel_files = chosen_kernel_files(kernel or [])
    sizes = {"layers": layers, "batch": batch, "seq": seq}
    config = PRESETS[preset].model_copy(update={k: v for k, v in sizes.items() if v is not None})
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu and preset != "tiny":
        raise UserError(NO_GPU_E2E)
    from ..bench.report import e2e_attention_in_step, e2e_floor, e2e_goal, e2e_gradients, e2e_table
    from ..bench.runner import command_line, write_run

    device = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    json_path, md_path = default_paths(device, suffix=E2E_SUFFIX)
    json_path = json_out or json_path
    md_path = md_out or (json_path.with_suffix(".md") if json_out else md_path)
    # a CPU run's times mean nothing: its files only where asked for
    save = save and (on_gpu or json_out is not None or md_out is not None)
    t0 = time.monotonic()
    # a timeout's SIGTERM as Ctrl-C: past the timing, the run keeps what it measured and is written
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run = run_e2e(config, device="cuda" if on_gpu else "cpu", device_name=device, command=command_line(),
                      plan=step_plan(warmup, steps), variants=variant or DEFAULT_VARIANTS, top=top,
                      kernel_files=kernel_files, gradients=gradients,
                      progress=lambda msg: print(f"[{time.monotonic() - t0:7.1f} s] {msg}", flush=True))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    finally:
        signal.signal(signal.SIGTERM, before)
    wide_console().print(e2e_table(run))
    console.print(e2e_goal(run), highlight=False, markup=False)
    for line in [*filter(None, [e2e_floor(run)]), *e2e_gradients(run),
                 *filter(None, [e2e_attention_in_step(run)])]:
        console.print(line, highlight=False, markup=False)
    if save:
        for p in write_run(run, json_path, md_path):
            console.print(f"wrote {p}")
    if any(v.gradients is not None and not v.gradients.passed for v in run.variants):
        raise typer.Exit(1)
    if any(n.startswith(CUT_SHORT) for n in run.notes):
        console.print(f"bench-e2e: {CUT_SHORT}: the results hold what was measured before", highlight=False,
                      markup=False)
        raise typer.Exit(130)
