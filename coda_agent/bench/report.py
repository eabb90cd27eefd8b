"""Rendering a :class:`BenchRun` or an :class:`E2ERun`: rich tables for the terminal, a markdown summary for
the repository.

Ratios are baseline time / kernel time: above 1 the kernel is faster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from rich.table import Table

from ..measure.timing import Timing
from .results import (
    ATTENTION_KIND,
    CUDA_KERNELS,
    FLOOR_MOONSHOT,
    NON_ATTENTION_GOAL,
    BenchRow,
    BenchRun,
    E2ERun,
    E2EVariant,
    GpuTimeline,
    Measured,
    PeakBreakdown,
)

#: Minimum kernel speed relative to cuBLAS alone, at every bench shape (the 1B and ragged ones too): the
#: epilogue should be nearly free; a block's GEMMs are held to the sum of their cuBLAS times.
CUBLAS_TARGET = {"block": 1.0}
CUBLAS_TARGET_DEFAULT = 0.97
COMPILE_TARGET = 1.0

COLUMNS = ("shape", "ok", "launches", "kernel µs (p10-p90)", "eager µs", "compile µs", "max-autotune µs",
           "cuBLAS µs", "x eager", "x compile", "x cuBLAS", "% SoL", "TFLOP/s", "TB/s")


def _us(t: Timing | None) -> str:
    """A median in µs; ``(wall)`` marks one the wall clock set because the events claimed clearly less."""
    if t is None:
        return "-"
    return f"{t.median_us:,.1f}" + (f" (wall; events {t.events_median_us:,.1f})" if t.bound == "wall"
                                    and t.events_median_us else "")


def _spread(t: Timing | None) -> str:
    """The kernel's median and spread, and its host time when that is what the GPU waited for."""
    if t is None:
        return "-"
    spread = "" if t.p10_us is None or t.p90_us is None else f" ({t.p10_us:,.0f}-{t.p90_us:,.0f})"
    host = (
        f"; host-bound: forward() {t.host_median_us:,.0f} on the host"
        if t.host_bound and t.host_median_us
        else ""
    )
    return f"{_us(t)}{spread}{host}"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _down(ratio: float | None) -> str:
    """Three decimals, rounded down: a ratio just short of its target (0.9996 against 1.0) never reads as
    meeting it."""
    return "-" if ratio is None else f"{math.floor(ratio * 1000 + 1e-9) / 1000:.3f}"


def row_cells(row: BenchRow) -> list[str]:
    return [
        row.shape,
        "yes" if row.correct else "NO",
        "-" if row.launches is None else str(row.launches),
        "not timed yet" if row.pending else _spread(row.candidate),
        _us(row.eager),
        _us(row.compiled),
        _us(row.compiled_max_autotune),
        _us(row.cublas),
        _num(row.ratio("eager"), ".2f"),
        _num(row.ratio("better_compile"), ".2f"),
        _num(row.ratio("cublas"), ".2f"),
        _num(row.pct_sol(), ".0f"),
        _num(row.tflops(), ".0f"),
        _num(row.tbps(), ".2f"),
    ]


def by_task(rows: Iterable[BenchRow]) -> dict[str, list[BenchRow]]:
    out: dict[str, list[BenchRow]] = {}
    for r in rows:
        out.setdefault(r.task, []).append(r)
    return out


def task_table(task: str, rows: list[BenchRow]) -> Table:
    """The terminal table for one task."""
    fam = rows[0].family if rows else ""
    table = Table(title=f"{task}" + (f" ({fam})" if fam else ""), title_justify="left")
    for i, col in enumerate(COLUMNS):
        table.add_column(col, justify="left" if i < 2 else "right", no_wrap=i == 0)
    for r in rows:
        cells = row_cells(r)
        if not r.correct:
            cells[1] = "[bold red]NO[/]"
        table.add_row(*cells)
    return table


@dataclass(frozen=True)
class TargetCheck:
    """One row measured against the issue's performance targets, by each side's fastest round
    (:meth:`BenchRow.fastest_ratio`: the paired median swings with the H200's clock modes); the paired ratios
    of the tables are named beside them."""

    row: BenchRow
    cublas_needed: float
    cublas_ratio: float | None
    compile_ratio: float | None

    @property
    def met(self) -> bool:
        return (
            self.row.correct
            and self.cublas_ratio is not None and self.cublas_ratio >= self.cublas_needed
            and self.compile_ratio is not None and self.compile_ratio >= COMPILE_TARGET
        )

    def describe(self) -> str:
        r = self.row
        parts = [f"{_down(self.cublas_ratio)}x cuBLAS (need {self.cublas_needed}; paired "
                 f"{_down(r.ratio('cublas'))}x)",
                 f"{_down(self.compile_ratio)}x the better torch.compile (need {COMPILE_TARGET}; paired "
                 f"{_down(r.ratio('better_compile'))}x)"]
        if r.family == "block":
            parts.append(f"{_num(r.ratio('eager'), '.2f')}x eager")
        if r.candidate is not None and r.candidate.host_bound:
            parts.append(f"host-bound ({r.candidate.host_median_us:,.0f} µs of host time per call)")
        return f"{r.task} @ {r.shape}: " + ", ".join(parts)


def target_checks(run: BenchRun) -> list[TargetCheck]:
    """The rows that have a verdict: failed or timed (a row still pending its timing is neither met nor
    missed)."""
    return [
        TargetCheck(
            row=r, cublas_needed=CUBLAS_TARGET.get(r.family, CUBLAS_TARGET_DEFAULT),
            cublas_ratio=r.fastest_ratio("cublas"), compile_ratio=r.fastest_ratio("better_compile"),
        )
        for r in run.rows
        if not r.pending
    ]


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _provenance(run: Measured) -> list[str]:
    """The lines every committed bench summary opens with (after its title)."""
    return [
        "",
        f"- command: `{run.command}`",
        f"- device: {run.device}, driver {run.driver or '?'}; git {run.git_commit or '?'}",
        "- packages: " + ", ".join(f"{k} {v}" for k, v in run.packages.items()),
    ]


def markdown_summary(run: BenchRun) -> str:
    """The committed summary: provenance, one table per task, the targets, and every failure's reason."""
    lines = [
        f"# Bench: human kernels on {run.device} ({run.created:%Y-%m-%d})",
        *_provenance(run),
        f"- measured peaks: {_num(run.peak_tflops_bf16, '.0f')} TFLOP/s bf16, "
        f"{_num(run.peak_hbm_tbps, '.2f')} TB/s HBM"
        + (f" ({run.peaks_method})" if run.peaks_method else ""),
        f"- timing: {run.timing_method}",
        f"- correctness: gpu_correctness stage, {run.correctness_seeds} seeds per shape",
        f"- torch.compile baselines: mode {', '.join(run.compile_modes)} (static shapes)",
        "- ratios are baseline time / kernel time (above 1: the kernel is faster), paired: the median over "
        "the interleaved rounds of the two batches timed in each round (the GPU's clock moves under its "
        "power cap in bursts longer than a round; rows timed before rounds were kept: the ratio of the "
        "medians); cuBLAS = the task's GEMMs alone; x compile = against the faster of torch.compile's "
        "default and max-autotune-no-cudagraphs modes (those timed); % SoL = max(FLOPs / peak, min bytes / "
        "bandwidth) / kernel time",
        "",
    ]
    for task, rows in by_task(run.rows).items():
        lines += [f"## {task}" + (f" ({rows[0].family})" if rows[0].family else ""), "",
                  _md_row(list(COLUMNS)),
                  _md_row(["---"] * len(COLUMNS))]
        lines += [_md_row(row_cells(r)) for r in rows]
        lines.append("")
    checks = target_checks(run)
    if checks:
        met = [c for c in checks if c.met]
        untimed = len(run.rows) - len(checks)
        lines += [
            "## Targets",
            "",
            f"{len(met)} of {len(checks)} rows meet both targets (>= {CUBLAS_TARGET_DEFAULT}x cuBLAS alone, "
            f">= {CUBLAS_TARGET['block']}x the sum of its GEMMs for a block, and >= {COMPILE_TARGET}x the "
            "better torch.compile)" + (f"; {untimed} more rows are not timed yet." if untimed else ".")
            + " Ratios here are each side's fastest round (a round: one batch's median), which the H200's "
            "two clock modes do not move as they move the tables' paired medians; the paired ones follow.",
            "",
        ]
        lines += [f"- {'met' if c.met else '**missed**'}: {c.describe()}" for c in checks]
        lines.append("")
    pending = [r for r in run.rows if r.pending]
    if pending:
        lines += [f"{len(pending)} correct rows are not timed yet: the bench stopped before their timing "
                  "phase (`coda-agent bench --resume` with the same `--json` carries on).", ""]
    unchecked = run.unchecked_tasks()
    if unchecked:
        lines += [f"Not checked yet, so not in the tables: {', '.join(unchecked)} (`coda-agent bench "
                  "--resume` with the same `--json` carries on).", ""]
    failed = [r for r in run.rows if not r.correct]
    if failed:
        lines += ["## Failures", ""]
        lines += [f"- {r.task} @ {r.shape}: "
                  f"{r.verdict_reason.splitlines()[0] if r.verdict_reason else 'failed'}" for r in failed]
        lines.append("")
    return "\n".join(lines)


E2E_COLUMNS = ("variant", "model", "torch.compile", "step ms (p10-p90)", "tokens/s", "non-attention ms",
               "CODA x step", "CODA x non-attention", "peak GiB", "step GiB", "loss")
#: The terminal's narrower table (the markdown has every column).
E2E_TERMINAL_COLUMNS = ("variant", "step ms (p10-p90)", "tokens/s", "non-attention ms", "CODA x step",
                        "CODA x non-attention", "peak GiB")
#: Kernel names (CuTe DSL, Triton) run to hundreds of characters; the markdown keeps their start, the JSON
#: all.
KERNEL_NAME_CHARS = 90


def _gib(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**30:.2f}"


def e2e_cells(run: E2ERun) -> list[list[str]]:
    """One row per variant, then the attention alone; speedups are the variant's time / CODA's."""
    rows = []
    for v in run.variants:
        ratio = run.speedups.get(v.name, {})
        compiled = "-" if v.compile_backend is None else f"{v.compile_backend}" + (f" {v.compile_mode}"
                                                                                   if v.compile_mode else "")
        step_gib = (
            None
            if v.peak_memory_bytes is None or v.resident_bytes is None
            else v.peak_memory_bytes - v.resident_bytes
        )
        rows.append([
            v.name, v.model, compiled,
            f"{v.step.median_us / 1e3:,.2f} ({_num(v.step.p10_us and v.step.p10_us / 1e3, ',.2f')}-"
            f"{_num(v.step.p90_us and v.step.p90_us / 1e3, ',.2f')})",
            f"{v.tokens_per_s:,.0f}", f"{v.non_attention_us / 1e3:,.2f}",
            _num(ratio.get("step"), ".3f"), _num(ratio.get("non_attention"), ".3f"),
            _gib(v.peak_memory_bytes), _gib(step_gib), _num(v.loss, ".4f"),
        ])
    c = run.config
    rows.append([f"attention ({c.layers} x SDPA fwd+bwd)", "-", "-",
                 f"{run.attention.median_us * c.layers / 1e3:,.2f}", *(["-"] * (len(E2E_COLUMNS) - 4))])
    return rows


def e2e_table(run: E2ERun) -> Table:
    """The terminal table of an end-to-end run."""
    table = Table(title=f"Llama-3 stack fwd+bwd ({run.config.preset}, {run.config.layers} layers, "
                        f"{run.config.batch} x {run.config.seq} tokens)", title_justify="left")
    shown = [E2E_COLUMNS.index(c) for c in E2E_TERMINAL_COLUMNS]
    for i in shown:
        table.add_column(E2E_COLUMNS[i], justify="left" if i == 0 else "right")
    for cells in e2e_cells(run):
        table.add_row(*(cells[i] for i in shown))
    return table


def e2e_goal(run: E2ERun) -> str:
    """The issue's goal, met or not, in one line."""
    best = run.best_compile
    if best is None:
        return (f"goal (>= {NON_ATTENTION_GOAL}x torch.compile on the non-attention time): no torch.compile "
                "variant was run")
    ratio = run.speedups[best.name]
    verdict = {True: "met", False: "missed",
               None: "not measurable (CODA's non-attention time is not positive)"}
    # the other CODA variants (another LM head, weight layout or kernel file) against the same baseline
    others = [f"{v.name} {best.non_attention_us / v.non_attention_us:.3f}x" for v in run.variants
              if v.model == "CodaLlamaStack" and v is not run.coda and v.non_attention_us > 0]
    return (f"goal (>= {NON_ATTENTION_GOAL}x the better torch.compile on the non-attention time): "
            f"{verdict[run.non_attention_goal_met]}: CODA is {_num(ratio['non_attention'], '.3f')}x "
            f"{best.name} on the non-attention time, {_num(ratio['step'], '.3f')}x on the whole step"
            + (f"; the other CODA variants on the non-attention time: {', '.join(others)}" if others else ""))


def e2e_floor(run: E2ERun) -> str | None:
    """Where the non-attention times stand against the step's GEMM floor, in one line; None where no floor
    was timed."""
    floor = run.gemm_floor
    if floor is None or floor.median_us <= 0:
        return None
    flops = sum(p.flops for p in run.gemm_products)
    against = []
    for v in run.variants:
        ratio = run.over_floor(v)
        extra = (v.non_attention_us - floor.median_us) / 1e3
        against.append(f"{v.name} {_num(ratio, '.3f')}x ({extra:+,.2f} ms)")
    coda = run.over_floor(run.coda)
    moonshot = "met" if coda is not None and coda <= FLOOR_MOONSHOT else "missed"
    products = sum(p.count for p in run.gemm_products)
    return (f"GEMM floor (the step's {products} GEMM products, {flops / 1e12:,.1f} TFLOP, alone on cuBLAS "
            f"back to back): {floor.median_us / 1e3:,.2f} ms ({flops / floor.median_us / 1e6:,.0f} TFLOP/s); "
            f"non-attention time over it: {', '.join(against)}; moonshot (CODA within {FLOOR_MOONSHOT}x of "
            f"it): {moonshot}")


def e2e_attention_in_step(run: E2ERun) -> str | None:
    """SDPA's kernels inside each variant's profiled step against the attention timed alone, in one line; None
    without a GPU profile. A step runs the same kernels at the clock the power cap leaves them, so inside it
    they take longer, and longer still after kernels that draw their joules densely (bench/README.md)."""
    inside = [f"{v.name} {k.total_us / 1e3:,.2f} ms" for v in run.variants
              if v.kernels_measured == CUDA_KERNELS for k in v.by_kind if k.kind == ATTENTION_KIND]
    if not inside:
        return None
    alone = run.attention.median_us * run.config.layers
    return (f"SDPA's kernels in one profiled step: {', '.join(inside)}, against {alone / 1e3:,.2f} ms timed "
            "alone between the steps: the same kernels, at the clock the power cap leaves them inside a step")


def e2e_energy(run: E2ERun) -> list[str]:
    """A line per variant whose joules a step were measured."""
    return [f"energy of {v.name}: {v.energy.joules:,.1f} J a step, {v.energy.watts:,.0f} W over "
            f"{v.energy.steps} steps back to back" for v in run.variants if v.energy is not None]


def e2e_gradients(run: E2ERun) -> list[str]:
    """A line per CODA variant whose gradients were checked: within the tolerance rule or not, and where."""
    lines = []
    for v in run.variants:
        g = v.gradients
        if g is None:
            continue
        where = f"one sequence of {g.tokens:,} tokens against FP32 autograd, the suite's tolerance rule"
        if g.passed:
            lines.append(f"gradients of {v.name} ({where}): every one within its allowance; nearest, "
                         f"{g.worst} at {g.worst_ratio:.2f} of it")
        else:
            lines.append(f"gradients of {v.name} ({where}): FAILED, {len(g.failed)} past their allowance "
                         f"({', '.join(g.failed)}); worst, {g.worst} at {g.worst_ratio:.2f}x it")
    return lines


def _short(name: str) -> str:
    return name if len(name) <= KERNEL_NAME_CHARS else name[: KERNEL_NAME_CHARS - 1] + "…"


def _timeline_rows(t: GpuTimeline) -> list[str]:
    """The GPU's idle time inside the profiled step: by what ended each gap, and the longest gaps."""
    gaps = sum(k.count for k in t.idle_by_next_kind)
    share = 100 * t.idle_us / t.span_us if t.span_us else 0.0
    lines = [f"The GPU sat idle {t.idle_us / 1e3:,.2f} ms of the profiled step's {t.span_us / 1e3:,.2f} ms "
             f"({share:.1f}%), in {gaps:,} {'gap' if gaps == 1 else 'gaps'} between kernels. By the kind of "
             "kernel that ended each gap:", "",
             _md_row(["next kernel's kind", "gaps", "idle µs"]), _md_row(["---"] * 3)]
    lines += [_md_row([k.kind, str(k.count), f"{k.total_us:,.0f}"]) for k in t.idle_by_next_kind]
    lines += ["", "The longest gaps:", "", _md_row(["idle µs", "after", "before"]), _md_row(["---"] * 3)]
    lines += [_md_row([f"{g.us:,.0f}", f"`{_short(g.before)}`", f"`{_short(g.after)}`"]) for g in t.longest]
    return [*lines, ""]


def _peak_rows(name: str, p: PeakBreakdown) -> list[str]:
    """What one variant's step held at its memory peak, by where it was allocated."""
    gib = 1 << 30
    lines = [f"### {name}: at its memory peak, {p.step_bytes / gib:,.2f} GiB allocated in the step", "",
             _md_row(["allocated at", "GiB", "blocks"]), _md_row(["---"] * 3)]
    lines += [_md_row([f"`{s.where}`", f"{s.bytes / gib:,.3f}", str(s.blocks)]) for s in p.shares]
    return [*lines, ""]


def _kernel_rows(v: E2EVariant) -> list[str]:
    lines = [f"### {v.name}: {v.kernels_measured} of one step ({v.kernel_total_us / 1e3:,.2f} ms in all)", ""]
    if v.timeline is not None:
        lines += _timeline_rows(v.timeline)
    if v.by_kind:
        lines += [_md_row(["kind", "count", "total µs", "% of all"]), _md_row(["---"] * 4)]
        lines += [_md_row([k.kind, str(k.count), f"{k.total_us:,.0f}",
                           f"{100 * k.total_us / v.kernel_total_us if v.kernel_total_us else 0.0:.1f}"])
                  for k in v.by_kind]
        lines.append("")
    lines += [f"The top {len(v.top_kernels)}:", "", _md_row(["kernel", "count", "total µs", "% of all"]),
              _md_row(["---"] * 4)]
    for k in v.top_kernels:
        share = 100 * k.total_us / v.kernel_total_us if v.kernel_total_us else 0.0
        lines.append(_md_row([f"`{_short(k.name)}`", str(k.count), f"{k.total_us:,.0f}", f"{share:.1f}"]))
    return [*lines, ""]


def e2e_markdown(run: E2ERun) -> str:
    """The committed summary of an end-to-end run: provenance, the variants, the goal, the top kernels."""
    c = run.config
    measures = [*e2e_gradients(run), *e2e_energy(run), *filter(None, [e2e_attention_in_step(run)])]
    lines = [
        f"# End-to-end bench: Llama-3 stack forward+backward on {run.device} ({run.created:%Y-%m-%d})",
        *_provenance(run),
        f"- model: preset {c.preset}: dim {c.dim}, ffn {c.ffn_dim}, {c.n_heads}/{c.n_kv_heads} heads, vocab "
        f"{c.vocab}, {c.layers} layers, batch {c.batch} x {c.seq} = {c.tokens:,} tokens, {c.dtype}",
        f"- timing: {run.timing_method}",
        f"- {run.attention_method}",
        "- CODA x: the variant's time / CODA's (above 1: CODA is faster; the step's paired round by round); "
        "step GiB = peak - resident (weights of every variant and the batch)",
        *(f"- note: {n}" for n in run.notes),
        *(f"- coda-kernels: {f.task} from `{f.path}` (sha256 {f.sha256[:12]})" for f in run.kernel_files),
        "",
        "## Steps",
        "",
        _md_row(list(E2E_COLUMNS)),
        _md_row(["---"] * len(E2E_COLUMNS)),
        *(_md_row(cells) for cells in e2e_cells(run)),
        "",
        e2e_goal(run),
        "",
        *([floor, ""] if (floor := e2e_floor(run)) else []),
        *(f"- {line}" for line in measures),
        *([""] if measures else []),
        "## Kernels that made the difference",
        "",
    ]
    best = run.best_compile
    shown = [run.coda, *([best] if best is not None else [])]
    for v in shown:
        lines += _kernel_rows(v)
    peaks = [(v.name, v.peak_breakdown) for v in shown if v.peak_breakdown is not None]
    if peaks:
        lines += ["## What the step held at its memory peak", ""]
        for name, breakdown in peaks:
            lines += _peak_rows(name, breakdown)
    return "\n".join(lines)
