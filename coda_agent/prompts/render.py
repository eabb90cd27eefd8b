"""Rendering the agent's messages: system (contract + API + examples), task, and feedback on past attempts.

The wording lives in ``templates/*.j2``; this module turns a Task and recorded Attempts into the plain data
those templates print. Everything here is a pure function of its arguments, so a resumed run rebuilds
exactly the prompts the interrupted one would have sent.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import jinja2

from ..store.ranking import attempt_time_us, shape_ratio
from ..store.records import Attempt, ChatMessage
from ..tasks.loader import BUILTIN_TASK_DIR, TaskError, load_task, task_files
from ..tasks.model import Task
from ..verifier import static
from ..verifier.tuning import pinned_schedule, schedule_text
from ..verifier.verdict import Outcome, OutputCheck, Verdict
from .api_reference import api_reference

TEMPLATE_DIR = Path(__file__).parent / "templates"
#: Closest to success first: which attempt of a round the conversation continues from.
OUTCOME_RANK = {
    "passed": 0, "wrong_output": 1, "over_launch_budget": 2, "cheat_detected": 3, "compile_error": 4,
    "runtime_error": 5, "timeout": 6, "crash": 7, "static_rejected": 8, "infra_error": 9, "unverified": 10,
    "no_code": 11, "provider_error": 12,
}
HISTORY_ROWS = 40
#: What each of a round's K candidates is asked to try (slot i takes entry i mod len), so they do not all converge.
APPROACHES = (
    "refine the best candidate so far (or, with none yet, the most direct fusion of the reference): the smallest "
    "change that makes it faster",
    "a different GEMM `Config` (tile_m, tile_n, cluster, pingpong or cooperative) from the best candidate's, "
    "suited to the bench shapes",
    "a different split of the work: what the epilogue computes, what goes into reduce sinks, and what (if anything) "
    "is left to a second gemm or to host ops",
    "a different algebra: reorder or re-associate the computation so fewer bytes move and fewer launches are needed "
    "(e.g. fold a scale into an operand, or reuse a statistic)",
)
#: The speed targets a run can name (``RunHeader.target`` keys), as the feedback spells them.
GOAL_NAMES = {"speedup_vs_human": "the human kernel", "speedup_vs_cublas": "cuBLAS alone", "sol_fraction": "SoL"}
BASELINE_NAMES = {"cublas": "cuBLAS alone", "compiled": "torch.compile", "eager": "eager"}
BOUND_ADVICE = {
    "memory": "memory-bound: the time goes to bytes moved. Read each input and write each output once, keep "
    "intermediates in the epilogue's registers instead of HBM, and drop host ops that make extra passes",
    "compute": "compute-bound: the time goes to the GEMM mainloop. Choose a `Config` (tile, cluster, pingpong or "
    "cooperative) that fills the SMs at this shape, and keep the epilogue light",
}
ERROR_LINES, ERROR_CHARS = 30, 2500


class SolLike(Protocol):
    """A speed-of-light point (``coda_agent.agent.timing.SolPoint``), read-only."""

    @property
    def shape(self) -> str: ...

    @property
    def dims(self) -> str: ...

    @property
    def flops(self) -> float: ...

    @property
    def bytes(self) -> float: ...

    @property
    def compute_us(self) -> float: ...

    @property
    def memory_us(self) -> float: ...

    @property
    def sol_us(self) -> float: ...

    @property
    def bound(self) -> str: ...


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR), undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, autoescape=False,
    )


def _render(name: str, **data: Any) -> str:
    return _env().get_template(name).render(**data).strip() + "\n"


# --- worked examples ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """A hand-written kernel of another task, shown to the model as a worked example."""

    name: str
    family: str
    description: str
    reference_name: str
    reference_source: str
    kernel_source: str
    needs: frozenset[str] = frozenset()

    @property
    def primitives(self) -> frozenset[str]:
        """The primitive names the kernel imports (what the example teaches)."""
        try:
            tree = ast.parse(self.kernel_source)
        except SyntaxError:
            return frozenset()
        return frozenset(
            a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == static.PRIMITIVES for a in n.names
        )

    @property
    def size(self) -> int:
        return len(self.reference_source) + len(self.kernel_source) + len(self.description)


def _normalised(source: str) -> str:
    return re.sub(r"\s+", " ", source).strip()


def _call_shape(node: ast.expr) -> str:
    """``ColVecReduce(scaled=True)`` -> ``ColVecReduce(scaled=True)``; operand names (``index=``) left out."""
    if not isinstance(node, ast.Call):
        return ast.dump(node)
    name = node.func.id if isinstance(node.func, ast.Name) else ast.dump(node.func)
    kwargs = sorted(f"{k.arg}={ast.dump(k.value)}" for k in node.keywords if k.arg != "index")
    return f"{name}({', '.join(kwargs)})"


def epilogue_signatures(source: str) -> set[str]:
    """A structural fingerprint of each ``@epilogue`` in a kernel: mode, extra outputs, pins, sinks, C.

    Names and arithmetic are left out on purpose: two kernels with the same fingerprint solve the same
    fused problem, which is how a block task that embeds the target's kernel is recognised.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) and dec.func.id == "epilogue"):
                continue
            kw = {k.arg: k.value for k in dec.keywords}
            outputs = dec.args[0] if dec.args else kw.get("outputs")
            n_outputs = len(outputs.elts) if isinstance(outputs, (ast.Tuple, ast.List)) else 0
            mode = kw.get("mode")
            pins = kw.get("operands")
            sinks = kw.get("reduces")
            pin_shapes = sorted(_call_shape(v) for v in pins.values if v is not None) if isinstance(pins, ast.Dict) else []
            sink_shapes = sorted(_call_shape(v) for v in sinks.values if v is not None) if isinstance(sinks, ast.Dict) else []
            has_c = any(a.arg == "c" for a in fn.args.args)
            found.add(
                f"mode={ast.literal_eval(mode) if isinstance(mode, ast.Constant) else 'element'} outputs={n_outputs} "
                f"pins={pin_shapes} sinks={sink_shapes} c={has_c}"
            )
    return found


def _role(symbol: str | int, m: str, n: str, k: str) -> str:
    """A dimension's role in the task's first GEMM: M, N, K, N/2 (one of a packed pair's halves) or other."""
    sym = str(symbol).replace(" ", "")
    roles = {m: "M", n: "N", k: "K"}
    if sym in roles:
        return roles[sym]
    return "N/2" if f"2*{sym}" == n else "other"


def task_needs(task: Task) -> frozenset[str]:
    """What a kernel for ``task`` has to do, from its tensors' shapes against its first GEMM: row or column
    statistics (a reduce sink), vector and full-tile operands, packed pairs (``acc_pair`` mode), extra
    outputs, integer indices, several GEMMs. Worked examples are picked to cover these, not only by wording."""
    if not task.gemms:
        return frozenset({f"family:{task.family}"})
    m, n, k = (str(d).replace(" ", "") for d in task.gemms[0])
    needs = {f"family:{task.family}"}
    if len(task.gemms) > 1:
        needs.add("gemms:several")
    full_outputs = 0
    for kind, specs in (("in", task.inputs), ("out", task.outputs)):
        for spec in specs:
            roles = ",".join(_role(d, m, n, k) for d in spec.shape)
            if kind == "in" and roles in ("M,K", "N,K"):
                continue  # the GEMM's own operands: every task has them
            integer = spec.dtype.startswith(("int", "uint"))
            needs.add(f"{kind}:{roles}" + (":int" if integer else ""))
            full_outputs += kind == "out" and roles in ("M,N", "M,N/2")
    if full_outputs > 1:
        needs.add("out:several-tiles")
    return frozenset(needs)


def library_examples(task: Task, library: Path | None = None) -> list[Example]:
    """Every other task with a human kernel, never the target's own solution.

    Refused: the target itself, the same kernel file or text, and any kernel containing an epilogue with
    the same structure as one of the target's (a block task embedding the target's kernel gives the
    answer away). Task files that fail to load are skipped: examples are help, not a reason to stop a run.
    By default the library is the task's own folder, then the built-in suite (a user's task still gets the
    suite's kernels as examples); a name seen once is not taken again.
    """
    folders = [library] if library else list(dict.fromkeys([task.path.parent.resolve(), BUILTIN_TASK_DIR.resolve()]))
    own_file = task.human_file.resolve() if task.human_file else None
    own_source = task.human_file.read_text() if task.human_file and task.human_file.exists() else None
    own_text = _normalised(own_source) if own_source is not None else None
    own_epilogues = epilogue_signatures(own_source) if own_source is not None else set()
    found: list[Example] = []
    for path in task_files(folders):
        try:
            other = load_task(path)
        except TaskError:
            continue
        human = other.human_file
        if other.name == task.name or other.name in {e.name for e in found} or human is None or not human.exists() or not other.reference_file.exists():
            continue
        kernel = human.read_text()
        if human.resolve() == own_file or _normalised(kernel) == own_text or own_epilogues & epilogue_signatures(kernel):
            continue
        found.append(
            Example(
                name=other.name, family=other.family, description=" ".join(other.description.split()),
                reference_name=other.reference, reference_source=other.reference_file.read_text().strip(),
                kernel_source=kernel.strip(), needs=task_needs(other),
            )
        )
    return found


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z][a-z0-9]+", text.lower()))


def select_examples(
    task: Task, *, library: Path | None = None, names: Sequence[str] | None = None, limit: int = 3, max_chars: int = 12000
) -> list[Example]:
    """Up to ``limit`` worked examples: the other tasks that best cover what the target needs
    (:func:`task_needs`) not yet covered by the examples chosen so far, then word overlap of description,
    conventions and reference code, then primitives not yet shown. ``names`` picks examples explicitly (the
    target itself is still refused).
    """
    pool = library_examples(task, library)
    if names is not None:
        by_name = {e.name: e for e in pool}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise TaskError(
                f"no usable example task(s) {missing} for {task.name} (available: {', '.join(sorted(by_name)) or 'none'})"
            )
        return [by_name[n] for n in names]
    target = _words(task.description + " " + task.conventions + " " + task.reference_file.read_text())
    needs = task_needs(task)

    def similarity(e: Example) -> float:
        words = _words(e.description + " " + e.reference_source)
        return len(target & words) / max(1, len(target | words))

    chosen: list[Example] = []
    shown: set[str] = set()
    covered: set[str] = set()
    remaining = sorted(pool, key=lambda e: e.name)
    while remaining and len(chosen) < limit:
        best = max(remaining, key=lambda e: (
            len((needs - covered) & e.needs) / max(1, len(needs)) + similarity(e) + 0.03 * len(e.primitives - shown),
            -len(e.name),
        ))
        remaining.remove(best)
        if chosen and sum(e.size for e in chosen) + best.size > max_chars:
            continue
        chosen.append(best)
        shown |= best.primitives
        covered |= best.needs & needs
    return chosen


# --- system and task messages ------------------------------------------------------------------


def system_prompt(examples: Sequence[Example]) -> str:
    """The contract, the generated API reference and the worked examples (the same for every attempt)."""
    return _render(
        "system.j2",
        api_reference=api_reference().strip(),
        examples=examples,
        torch_functions=sorted(static.TORCH_FUNCTIONS),
        torch_values=sorted(static.TORCH_VALUES),
        methods=sorted(static.METHODS),
        data_attrs=sorted(static.DATA_ATTRS),
        builtins=sorted(static.BUILTINS - {"True", "False", "None"}),
    )


def _init_text(spec: Any) -> str:
    ini = spec.init
    if ini.dist == "normal":
        return f"normal(mean {ini.mean}, std {ini.std})"
    if ini.dist == "uniform":
        return f"uniform[{ini.low}, {ini.high})"
    return f"randint[{ini.low}, {ini.high})"


def _shape_text(shape: Sequence[str | int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def task_prompt(
    task: Task,
    *,
    checks: str,
    target: str,
    sol: Sequence[SolLike],
    sol_label: str,
    human_us: Mapping[str, float] | None = None,
) -> str:
    """What to compute and how it is judged: signature, tensors, reference, shapes, tolerance, budget, SoL."""
    sol_by_shape = {p.shape: p.sol_us for p in sol}
    return _render(
        "task.j2",
        t=task,
        signature=", ".join([*(i.name for i in task.inputs), *task.constants]),
        returns=", ".join(f'"{o.name}": ...' for o in task.outputs),
        inputs=[
            {"name": i.name, "shape": _shape_text(i.shape), "dtype": i.dtype, "init": _init_text(i), "description": i.description}
            for i in task.inputs
        ],
        outputs=[{"name": o.name, "shape": _shape_text(o.shape), "dtype": o.dtype, "description": o.description} for o in task.outputs],
        constants=task.constants,
        reference_source=task.reference_file.read_text().strip(),
        shape_sets={name: task.summary_shapes(name) for name in task.shapes},
        tolerances=[
            {"name": o.name, "factor": f"{f:g}", "floor": f"{fl:g}"}
            for o in task.outputs
            for f, fl in [task.tolerance.for_output(o.name)]
        ],
        sol={"peaks_label": sol_label, "points": sol},
        human_timing=[{"shape": s, "us": us, "sol_us": sol_by_shape.get(s)} for s, us in (human_us or {}).items()],
        checks=checks,
        target=target,
    )


def describe_checks(task: Task, stages: Sequence[str], shape_set: str, seeds: Sequence[int]) -> str:
    """One paragraph on what this run's verifier does, in order."""
    steps = ["the static check (nothing runs if it refuses the module)"]
    shapes = ", ".join(p.name for p in task.shape(shape_set))
    seed_text = f"seed{'s' if len(seeds) != 1 else ''} {', '.join(str(s) for s in seeds)}"
    for name in stages:
        if name == "correctness":
            steps.append(f"the CPU emulator against the FP32 reference at the `{shape_set}` shapes ({shapes}), {seed_text}")
        elif name == "compile":
            steps.append("an sm_90a build of every kernel `forward()` launches (QuACK / CuTe DSL, no GPU needed)")
        elif name == "gpu_correctness":
            steps.append(f"real kernels on the GPU against the FP32 reference at the `{shape_set}` shapes, {seed_text}, "
                         "with the launch count checked against the budget")
        elif name == "profile":
            steps.append("GPU timing (median over repetitions) against the hand-written kernel and the baselines")
        else:
            steps.append(f"the `{name}` stage")
    return "Each candidate goes through " + "; then ".join(steps) + ". The first failing step ends the check."


# --- feedback ----------------------------------------------------------------------------------


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _times(r: float) -> str:
    """An error ratio: ``x0.337``, ``x12.5``, ``x1020`` (never exponent notation)."""
    return f"x{r:.0f}" if r >= 100 else f"x{r:.3g}"


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def trim_error(text: str, max_lines: int = ERROR_LINES, max_chars: int = ERROR_CHARS) -> str:
    """Head and tail of a long error, with a marker where lines were cut."""
    lines = text.strip().splitlines()
    if len(lines) > max_lines:
        head, tail = max_lines // 3, max_lines - max_lines // 3
        lines = [*lines[:head], f"... ({len(lines) - max_lines} lines cut) ...", *lines[-tail:]]
    out = "\n".join(lines)
    if len(out) > max_chars:
        out = out[: max_chars // 3] + "\n... (cut) ...\n" + out[-(2 * max_chars) // 3 :]
    return out


def _ratio(c: OutputCheck) -> float | None:
    if c.max_abs_err is None or not c.allowed:
        return None
    return c.max_abs_err / c.allowed


def _point_results(verdict: Verdict) -> dict[str, dict[str, bool]]:
    """output -> shape point -> passed at every seed."""
    out: dict[str, dict[str, bool]] = {}
    for st in verdict.stages:
        for c in st.checks:
            per = out.setdefault(c.output, {})
            per[c.shape_point] = per.get(c.shape_point, True) and c.ok
    return out


def _failing_outputs(verdict: Verdict) -> list[OutputCheck]:
    return [c for c in verdict.worst_checks() if not c.ok]


def attempt_headline(attempt: Attempt) -> str:
    """One line saying what happened to an attempt (history tables, progress display)."""
    outcome = attempt.outcome
    if outcome == "provider_error":
        return f"the model request failed: {(attempt.provider_error or '').splitlines()[0]}"
    if outcome == "no_code":
        return attempt.extraction_error or "the reply held no Python module"
    verdict = attempt.verdict
    if verdict is None:
        return "not verified"
    if verdict.passed:
        t = attempt.timing
        parts = ["correct"]
        if "speedup_vs_human" in t:
            parts.append(f"{t['speedup_vs_human']:.2f}x the human kernel")
        if "speedup_vs_cublas" in t:
            parts.append(f"{t['speedup_vs_cublas']:.2f}x cuBLAS alone")
        if "sol_fraction" in t:
            parts.append(f"{100 * t['sol_fraction']:.0f}% of SoL")
        if "geomean_us" in t and len(parts) == 1:
            parts.append(f"{t['geomean_us']:.1f} µs")
        if attempt.tuning is not None and attempt.tuning.adopted and attempt.tuning.before.get("geomean_us"):
            pinned = schedule_text(pinned_schedule(attempt.tuning.code))
            parts.append(f"once the harness tuned its configs (from {attempt.tuning.before['geomean_us']:.1f} µs; pinned: {pinned})")
        if not t:
            ran = {s.stage for s in verdict.stages}
            where = "on the GPU" if "gpu_correctness" in ran else "on the emulator" if "correctness" in ran else ""
            built = " and builds for sm_90a" if "compile" in ran else ""
            return " ".join(p for p in ("correct", where) if p) + built
        return ", ".join(parts)
    failing = _failing_outputs(verdict)
    if verdict.outcome is Outcome.WRONG_OUTPUT and failing:
        bits = []
        for c in failing[:3]:
            r = _ratio(c)
            if r is None:
                bits.append(c.reason.split(";")[0] if c.reason else f"{c.output}: wrong")
            else:
                bits.append(f"{c.output} err {_num(c.max_abs_err)} > {_num(c.allowed)} ({_times(r)}) at {c.worst_index} {c.shape_point}/{c.seed}")
        more = f" (+{len(failing) - 3} more)" if len(failing) > 3 else ""
        return "; ".join(bits) + more
    lines = [ln.strip() for ln in verdict.reason.strip().splitlines() if ln.strip()]
    if not lines:
        return verdict.outcome.value
    if verdict.outcome is Outcome.STATIC_REJECTED and len(lines) > 1:
        return "; ".join(lines[1:3]) + (f" (+{len(lines) - 3} more)" if len(lines) > 3 else "")
    return lines[-1][:300]


def _violations(attempt: Attempt) -> list[dict[str, Any]]:
    verdict = attempt.verdict
    if verdict is None or verdict.outcome is not Outcome.STATIC_REJECTED:
        return []
    code_lines = (attempt.code or "").splitlines()
    out = []
    for m in re.finditer(r"^line (\d+): (.+)$", verdict.reason, flags=re.MULTILINE):
        n = int(m.group(1))
        source = code_lines[n - 1].strip() if 1 <= n <= len(code_lines) else ""
        out.append({"line": n, "message": m.group(2), "source": source})
    return out


def _check_rows(verdict: Verdict) -> tuple[list[dict[str, Any]], list[str]]:
    points = _point_results(verdict)
    rows, notes = [], []
    for c in verdict.worst_checks():
        per = points.get(c.output, {})
        fails = [p for p, ok in per.items() if not ok]
        r = _ratio(c)
        rows.append({
            "output": c.output, "ok": c.ok, "err": _num(c.max_abs_err), "allowed": _num(c.allowed),
            "ratio": "-" if r is None else f"{r:.3g}" if r < 100 else f"{r:.0f}", "where": str(c.worst_index) if c.worst_index is not None else "-",
            "got": _num(c.worst_value), "expected": _num(c.expected_value), "at": f"{c.shape_point}/{c.seed}",
            "fails_at": ", ".join(fails) if fails else "-",
        })
        if c.ok:
            continue
        if r is None:
            notes.append(f"`{c.output}`: {c.reason}")
        elif r <= 10:
            notes.append(
                f"`{c.output}` is close ({_times(r)} the tolerance): look for lost precision, e.g. an intermediate rounded "
                "to the task dtype, or a statistic taken from a rounded value instead of the FP32 accumulator."
            )
        else:
            notes.append(f"`{c.output}` is far off ({_times(r)} the tolerance): its formula differs from the reference.")
        passing = [p for p, ok in per.items() if ok]
        if fails and passing:
            notes.append(
                f"`{c.output}` fails at {', '.join(fails)} but passes at {', '.join(passing)}: compare those shapes "
                "(a dimension that is not a tile multiple, or an M == N ambiguity)."
            )
    return rows, notes


def _timing_view(timing: Mapping[str, Any]) -> dict[str, Any] | None:
    shapes = timing.get("shapes") or {}
    if not shapes:
        return None
    present = {b for s in shapes.values() for b in s.get("baselines", {})}
    baselines = [b for b in BASELINE_NAMES if b in present]

    def ratio(num: float | None, den: float) -> str:
        return f"{num / den:.2f}x" if num else "-"

    rows = []
    for name, s in shapes.items():
        us = s["median_us"]
        rows.append({
            "shape": name, "us": _us(us), "human_us": _us(s.get("human_us")), "vs_human": ratio(s.get("human_us"), us),
            "vs": {b: ratio(s.get("baselines", {}).get(b), us) for b in baselines},
            "sol_us": _us(s.get("sol_us")), "sol_pct": f"{100 * s['sol_us'] / us:.0f}%" if s.get("sol_us") else "-",
            "bound": s.get("bound", "-"),
        })
    return {"rows": rows, "baselines": [{"key": b, "name": BASELINE_NAMES[b]} for b in baselines]}


def _attempt_view(attempt: Attempt, *, is_lead: bool) -> dict[str, Any]:
    verdict = attempt.verdict
    view: dict[str, Any] = {
        "index": attempt.index, "is_lead": is_lead, "outcome": attempt.outcome.upper().replace("_", " "),
        "headline": attempt_headline(attempt), "truncated": attempt.finish_reason in ("length", "max_tokens"),
        "violations": _violations(attempt), "error_text": "", "checks": [], "check_notes": [], "timing": None,
        "code": None if is_lead else attempt.code,
    }
    if view["violations"]:
        view["headline"] = ""  # the list below says it all
    if verdict is not None and not verdict.passed and verdict.outcome not in (Outcome.STATIC_REJECTED, Outcome.WRONG_OUTPUT):
        view["error_text"] = trim_error(verdict.reason)
    if verdict is not None and any(s.checks for s in verdict.stages) and not verdict.passed:
        view["checks"], view["check_notes"] = _check_rows(verdict)
    if attempt.timing:
        view["timing"] = _timing_view(attempt.timing)
    return view


def rank_key(attempt: Attempt) -> tuple[float, ...]:
    """Sort key, best first: outcome, then time (passed, as ``store.ranking``) or error ratio (wrong output), then slot."""
    rank = OUTCOME_RANK.get(attempt.outcome, 10)
    us = attempt_time_us(attempt) if attempt.passed else None
    err = 0.0
    if attempt.verdict is not None and attempt.outcome == "wrong_output":
        ratios = [r for c in attempt.verdict.worst_checks() if (r := _ratio(c)) is not None]
        err = max(ratios) if ratios else float("inf")
    return (rank, float(us is None), us or 0.0, err, attempt.slot)


def _replied(attempts: Iterable[Attempt]) -> list[Attempt]:
    """Attempts the model actually produced (a failed request says nothing about the model's code)."""
    return [a for a in attempts if a.raw_response is not None]


def lead_attempt(attempts: Sequence[Attempt]) -> Attempt | None:
    """The attempt the conversation continues from: the best reply of the latest round that has one."""
    replied = _replied(attempts)
    if not replied:
        return None
    last_round = max(a.round for a in replied)
    return min((a for a in replied if a.round == last_round), key=rank_key)


def _ratio_text(key: str, value: float) -> str:
    """A target ratio as the feedback prints it: ``54%`` of SoL, ``0.80x`` of anything else."""
    return f"{100 * value:.0f}%" if key == "sol_fraction" else f"{value:.2f}x"


def _speed_steps(best: Attempt, goals: Mapping[str, float]) -> list[str]:
    """Where the best candidate stands against the run's target, and the shape farthest behind it."""
    t = best.timing
    steps = []
    for goal, wanted in goals.items():
        have = t.get(goal)
        if have is None:
            continue
        ratios = {name: r for name, sh in (t.get("shapes") or {}).items() if (r := shape_ratio(sh, goal)) is not None}
        text = (
            f"Target: {_ratio_text(goal, wanted)} of {GOAL_NAMES.get(goal, goal)} (geomean over the bench shapes); "
            f"the best is at {_ratio_text(goal, have)}."
        )
        if ratios:
            worst = min(ratios, key=lambda n: ratios[n])
            bound = t["shapes"][worst].get("bound")
            text += f" Farthest behind: `{worst}` at {_ratio_text(goal, ratios[worst])}"
            text += f", {BOUND_ADVICE[bound]}." if bound in BOUND_ADVICE else "."
        steps.append(text)
    return steps


def _next_steps(
    lead: Attempt, latest: Sequence[Attempt], best: Attempt | None, goal_is_speed: bool, goals: Mapping[str, float]
) -> list[str]:
    if best is not None:
        if not goal_is_speed:
            return ["A correct candidate exists; improve on it only if you see a clear gain, and keep it correct."]
        steps = [
            "Keep it correct and make it faster; start from the best candidates above.",
            *_speed_steps(best, goals),
            "Move every element-wise op on (M, N) data into the epilogue fn and every row/column statistic into a "
            "reduce sink; count your launches against the budget.",
            "Pick a GEMM `Config` (tile_m, tile_n, cluster, pingpong) suited to the bench shapes; the default is "
            "128x192, 2x1 cluster, pingpong.",
        ]
        if any(a.outcome != "passed" for a in latest):
            steps.append("Some candidates of the last round failed: do not trade correctness for speed.")
        return steps
    advice = {
        "no_code": "Answer with the whole module in one ```python block.",
        "static_rejected": "Fix every violation listed above; the module was refused before anything ran.",
        "runtime_error": "forward() raised: the lines shown are from your module; fix the call, the shapes or the epilogue contract.",
        "compile_error": "The sm_90a build failed: keep to the value functions and modes the API reference lists, and "
        "check the Config rules; the lines shown are from your module.",
        "wrong_output": "Compare your algebra with the reference line by line, output by output; the table says which "
        "outputs are wrong, where, and by how much.",
        "cheat_detected": "Follow the contract: inputs are read-only, no state across calls, no side streams.",
        "over_launch_budget": "Launch fewer kernels: fuse the host-side torch ops into the epilogue or a reduce sink.",
        "timeout": "It ran too long: remove loops over rows or tiles in Python; one gemm() does the whole matrix.",
        "crash": "The worker process died: avoid out-of-bounds indexing and huge intermediate tensors.",
        "infra_error": "The harness failed, not your code: resubmit the candidate (fixing anything else you see).",
    }
    steps = [advice.get(lead.outcome, "Fix the error above.")]
    if lead.finish_reason in ("length", "max_tokens"):
        steps.append("Your reply was cut off: reason briefly, then give the complete module.")
    steps.append("Correctness comes first; speed only counts once every output passes.")
    return steps


def _population_view(population: Sequence[Attempt], shown: set[int]) -> list[dict[str, Any]]:
    rows = []
    for a in population:
        t = a.timing
        rows.append({
            "index": a.index, "round": a.round, "us": _us(attempt_time_us(a)), "headline": attempt_headline(a),
            "vs": {k: _ratio_text(k, t[k]) if k in t else "-" for k in GOAL_NAMES},
            "code": None if a.index in shown and a.shipped_code == a.code else a.shipped_code,
        })
    return rows


def feedback_prompt(
    attempts: Sequence[Attempt],
    *,
    population: Sequence[Attempt],
    goal_is_speed: bool,
    goals: Mapping[str, float] | None = None,
    lead: Attempt | None = None,
) -> str:
    """Structured results of all previous attempts: the latest round in detail, earlier ones as a table, and the
    population (the best distinct correct candidates, best first, as ``store.ranking`` orders them) with code."""
    replied = _replied(attempts)
    if not replied:
        raise ValueError("feedback needs at least one attempt with a model reply")
    lead = lead or lead_attempt(attempts)
    assert lead is not None
    last_round = max(a.round for a in replied)
    latest = sorted((a for a in replied if a.round == last_round), key=lambda a: (a.index != lead.index, a.slot))
    history = [a for a in replied if a.round < last_round][-HISTORY_ROWS:]
    best = population[0] if population else None
    n, passed = len(replied), sum(a.passed for a in replied)
    overview = f"{n} attempt{'s' if n != 1 else ''} so far, {passed} correct."
    if best is not None:
        overview += f" Best so far: attempt #{best.index} ({attempt_headline(best)})."
    return _render(
        "feedback.j2",
        overview=overview,
        population=_population_view(population, {a.index for a in latest}),
        timed=any(a.timing for a in population),
        latest=[_attempt_view(a, is_lead=a.index == lead.index) for a in latest],
        history=[
            {"index": a.index, "round": a.round, "outcome": a.outcome, "headline": attempt_headline(a).replace("|", "/")}
            for a in history
        ],
        next_steps=_next_steps(lead, latest, best, goal_is_speed, goals or {}),
    )


def approach_note(slot: int, slots: int) -> str:
    """What candidate ``slot`` of a round of ``slots`` should try; empty for a round of one."""
    if slots <= 1:
        return ""
    return (
        f"You are candidate {slot + 1} of {slots} written from this same message; the others take other approaches. "
        f"Yours: {APPROACHES[slot % len(APPROACHES)]}."
    )


def build_messages(
    system: str,
    task_message: str,
    attempts: Sequence[Attempt],
    *,
    population: Sequence[Attempt],
    goal_is_speed: bool,
    goals: Mapping[str, float] | None = None,
    slot: int = 0,
    slots: int = 1,
) -> list[ChatMessage]:
    """The chat for candidate ``slot`` of the next round: system, task, then (after round 1) the lead reply and
    the feedback; with several candidates per round the last message asks each for a different approach.

    The model sees its own best reply of the last round as its turn, and the results of every attempt
    so far (with the code of the attempts it did not "say" in this chat) as the next user turn.
    """
    messages = [ChatMessage(role="system", content=system)]
    note = approach_note(slot, slots)
    lead = lead_attempt(attempts)
    if lead is None:
        return [*messages, ChatMessage(role="user", content="\n\n".join(p for p in (task_message.rstrip(), note) if p) + "\n")]
    feedback = feedback_prompt(attempts, population=population, goal_is_speed=goal_is_speed, goals=goals, lead=lead)
    return [
        *messages,
        ChatMessage(role="user", content=task_message),
        ChatMessage(role="assistant", content=strip_thinking(lead.raw_response or "").strip() or "(empty reply)"),
        ChatMessage(role="user", content="\n\n".join(p for p in (feedback.rstrip(), note) if p) + "\n"),
    ]


def strip_thinking(text: str) -> str:
    """Drop ``<think>...</think>`` sections that reasoning models served over OpenAI-compatible APIs emit."""
    return re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.DOTALL)
