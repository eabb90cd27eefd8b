"""``coda-agent verify TASK CANDIDATE``: the same verifier the agent uses, on one file."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from ..atomic import write_text_atomic
from ..tasks.loader import find_task
from ..tasks.model import Baseline
from ..untrusted import shown
from ..verifier import COMPILE_STAGES, Plan, verify
from ..verifier.plan import DEFAULT_SEEDS
from ..verifier.verdict import Outcome, Verdict
from .core import (
    UserError,
    app,
    console,
    err_console,
    outcome_style,
    print_table,
    refuse_without_runners,
    untrusted,
)
from .inputs import (
    check_fits_device,
    check_shape_set,
    check_task_runs,
    default_timeout,
    read_candidate,
    seed_list,
    timeout_value,
)

#: ``--tolerance-baseline`` spellings and the baseline each names.
BASELINES: dict[str, Baseline] = {"eager": "eager", "single-rounding": "single_rounding"}
BASELINE_NAMES = {v: k for k, v in BASELINES.items()}
#: The stages that check a candidate's outputs: a pass without one of them says only that it builds.
CORRECTNESS_STAGES = ("correctness", "gpu_correctness")


def verdict_table(verdict: Verdict) -> Table:
    """Per output, the worst check over shapes and seeds."""
    worst = verdict.worst_checks()
    rules = ", ".join(sorted({BASELINE_NAMES[c.baseline] for c in worst}))
    table = Table(title=f"error vs FP32 reference (worst over shapes and seeds); tolerance baseline: {rules}")
    for col in ("output", "ok", "max |err|", "allowed", "baseline err", "worst at", "shape/seed"):
        table.add_column(col)
    for c in worst:
        fmt = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
        table.add_row(
            untrusted(c.output), "[green]yes[/]" if c.ok else "[red]no[/]", fmt(c.max_abs_err),
            fmt(c.allowed), fmt(c.lowp_err), str(c.worst_index) if c.worst_index is not None else "-",
            untrusted(c.input_set),
        )
    return table


def _kernels(n: object) -> str:
    return f"{n} kernel{'' if n == 1 else 's'}"


def launches_line(verdict: Verdict, budget: int) -> str | None:
    """What one call launched against the task's budget, at the first shape a correctness stage passed: the
    GPU's kernel trace, or the CPU's estimate with its host ops (what a task author sets a budget from)."""
    for s in verdict.stages:
        if s.stage not in CORRECTNESS_STAGES:
            continue
        shapes = s.details.get("shapes")
        for name, info in (shapes.items() if isinstance(shapes, dict) else ()):
            seen = info.get("launches") if isinstance(info, dict) else None
            if not isinstance(seen, dict) or not seen:
                continue
            if "launches" in seen:
                return f"{_kernels(seen['launches'])} at shape {name} (the GPU's trace), budget {budget}"
            ops = ", ".join(str(o) for o in seen.get("host_ops", [])) or "none"
            bench = s.details.get("bench_launches")
            at_bench = (f"; {', '.join(f'{n} at {shape}' for shape, n in bench.items())} on meta tensors"
                        if isinstance(bench, dict) and bench else "")
            return (f"{_kernels(seen.get('launches_estimate'))} at shape {name} (the CPU's estimate; host "
                    f"ops: {ops}){at_bench}, budget {budget}")
    return None


def cost_lines(verdict: Verdict) -> list[str]:
    """The sm_90a build's cost estimate at the bench shapes (its table and what a faster candidate would
    cut first), as the agent's feedback shows it; none where the build did not run or could not price the
    calls."""
    from ..store.ranking import verdict_estimate_fraction

    fraction = verdict_estimate_fraction(verdict)
    for s in verdict.stages:
        summary = s.details.get("cost_summary") if s.stage == "compile" else None
        if isinstance(summary, str) and summary:
            return [ln for ln in summary.splitlines() if ln and not ln.startswith("How far to trust it")] + (
                [f"By this estimate: {100 * fraction:.0f}% of the speed of light (geometric mean over the "
                 "bench shapes; a CPU run's target is 90%, --target-estimate)"] if fraction else [])
    return []


def print_verdict(verdict: Verdict, budget: int | None = None) -> None:
    for s in verdict.stages:
        mark = (f"[{outcome_style(s.outcome.value)}]"
                f"{'pass' if s.outcome is Outcome.PASSED else s.outcome.value}[/]")
        memory = f"  {s.memory.describe()}" if s.memory is not None and s.memory.describe() else ""
        console.print(f"  {s.stage:<16} {mark}  {s.seconds:6.1f} s{memory}", highlight=False)
    if budget is not None and (line := launches_line(verdict, budget)):
        console.print(f"  launches: {untrusted(line)}", highlight=False)
    if any(s.checks for s in verdict.stages):
        print_table(verdict_table(verdict))
    if lines := cost_lines(verdict):
        console.print("  cost estimate at the bench shapes (CPU, nominal H200; a floor from bytes, FLOPs and "
                      "launches):", highlight=False)
        for line in lines:
            console.print(f"  {untrusted(line)}", highlight=False)
    headline, scope = verdict.outcome.value.upper(), ""
    if verdict.passed and not any(s.stage in CORRECTNESS_STAGES for s in verdict.stages):  # --compile-only
        headline, scope = "COMPILES", " (sm_90a build only; correctness not checked)"
    console.print(f"[bold {outcome_style(verdict.outcome.value)}]{headline}[/] {untrusted(verdict.task)} "
                  f"v{verdict.task_version}{scope}",
                  highlight=False)
    if verdict.reason and not verdict.passed:
        console.print(shown(verdict.reason), highlight=False, markup=False)  # the candidate's words, inert
    if refused_a_host_name(verdict):  # the refusal says "the allowlist": here it is, as the feedback has it
        from ..prompts.feedback import host_allowlist

        console.print(host_allowlist(), highlight=False, markup=False)


def refused_a_host_name(verdict: Verdict) -> bool:
    """The static check refused a host name off its allowlist (not, say, a syntax error)."""
    return verdict.outcome is Outcome.STATIC_REJECTED and any(
        s.stage == "static" and s.details.get("allowlist") is True for s in verdict.stages)


@app.command("verify")
def verify_cmd(
    task: str = typer.Argument(..., help="task name or YAML path"),
    candidate: Path = typer.Argument(None, help="candidate .py (default: the task's human kernel)"),
    backend: str = typer.Option("torch", help="torch: the CPU emulator; quack: real kernels on a GPU"),
    compile_only: bool = typer.Option(False, "--compile-only",
                                      help="only build the kernels for sm_90a (no GPU needed)"),
    shapes: str = typer.Option(None, help="shape set (default: small for torch, bench for quack)"),
    seeds: int = typer.Option(len(DEFAULT_SEEDS), help="number of seeds"),
    timeout: float = typer.Option(
        None, help="seconds before the candidate counts as hung (default from the stages and shapes: 120 s "
                   "for the emulator)"
    ),
    tolerance_baseline: str = typer.Option(
        None, "--tolerance-baseline",
        help="judge by this baseline instead of the task's: eager (the reference in the task dtype) or "
             "single-rounding "
        "(the FP32 reference rounded once, as CODA's tests do)",
    ),
    json_out: Path = typer.Option(None, "--json", help="also write the verdict as JSON"),
) -> None:
    """Verify a candidate (or the task's human kernel) and print a per-output error table."""
    t = find_task(task)
    path = candidate or t.human_file
    if path is None:
        raise UserError(f"task {t.name} has no human kernel; pass a candidate file")
    chosen: dict[str, object]
    if compile_only:
        chosen = {"stages": COMPILE_STAGES, "backend": "quack-compile"}
    elif backend == "torch":
        chosen = {}  # the plan's defaults: the CPU emulator's check at the small shapes
    elif backend == "quack":
        import torch

        if not torch.cuda.is_available():
            raise UserError("no CUDA GPU on this machine: --backend quack runs the real kernels; on a CPU "
                            "use the emulator (the default) or --compile-only")
        chosen = {"stages": ("gpu_correctness",), "backend": "quack", "shape_set": "bench"}
    else:
        raise UserError(f"unknown backend {backend!r}: use torch or quack (or --compile-only)")
    # the task file's spelling (single_rounding) too
    baseline = (BASELINES.get(tolerance_baseline.replace("_", "-")) if tolerance_baseline is not None
                else None)
    if tolerance_baseline is not None and baseline is None:
        raise UserError(f"unknown --tolerance-baseline {tolerance_baseline!r}: use {' or '.join(BASELINES)}")
    given = {"shape_set": shapes} if shapes else {}
    plan = Plan.model_validate({**chosen, **given, "seeds": seed_list(seeds), "tolerance_baseline": baseline})
    check_shape_set(t, plan)
    check_task_runs(t)  # a broken reference is the task's fault, not a checker failure on the candidate
    check_fits_device(t, plan)
    plan = plan.model_copy(update={"timeout": timeout_value(timeout, default_timeout(t, plan))})
    source = read_candidate(path)
    console.print(f"verifying [bold]{untrusted(str(path))}[/] on [bold]{untrusted(t.name)}[/] "
                  f"({plan.backend}, shapes: {plan.shape_set})", highlight=False)
    box = refuse_without_runners()
    if not box.isolated:
        err_console.print(f"[bold yellow]warning:[/] {box.describe()}", highlight=False)
    verdict = verify(t, source, plan)
    print_verdict(verdict, t.launch_budget)
    if json_out:
        write_text_atomic(json_out, verdict.model_dump_json(indent=2))
    if not verdict.passed:
        raise typer.Exit(1)
