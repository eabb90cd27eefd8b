"""Rendering a :class:`BenchRun`: rich tables for the terminal, a markdown summary for the repository.

Ratios are baseline time / kernel time: above 1 the kernel is faster.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.table import Table

from ..measure.timing import Timing
from .results import BenchRow, BenchRun

#: Shapes the performance targets apply to (issue 3): the Llama-3 8B and CODA block bench shapes.
TARGET_SHAPE_PREFIXES = ("llama3-8b", "coda")
#: Minimum kernel speed relative to cuBLAS alone: the epilogue should be nearly free; a block's two GEMMs
#: are compared with the sum of their cuBLAS times.
CUBLAS_TARGET = {"block": 0.95}
CUBLAS_TARGET_DEFAULT = 0.97
COMPILE_TARGET = 1.0

COLUMNS = ("shape", "ok", "launches", "kernel µs (p10-p90)", "eager µs", "compile µs", "max-autotune µs", "cuBLAS µs",
           "x eager", "x compile", "x cuBLAS", "% SoL", "TFLOP/s", "TB/s")


def _us(t: Timing | None) -> str:
    """A median in µs; ``(wall)`` marks one the wall clock set because the events claimed clearly less."""
    if t is None:
        return "-"
    return f"{t.median_us:,.1f}" + (f" (wall; events {t.events_median_us:,.1f})" if t.bound == "wall" and t.events_median_us else "")


def _spread(t: Timing | None) -> str:
    if t is None:
        return "-"
    if t.p10_us is None or t.p90_us is None:
        return _us(t)
    return f"{_us(t)} ({t.p10_us:,.0f}-{t.p90_us:,.0f})"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


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
    """One row measured against the issue's performance targets."""

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
        parts = [f"{_num(self.cublas_ratio, '.3f')}x cuBLAS (need {self.cublas_needed})",
                 f"{_num(self.compile_ratio, '.3f')}x the better torch.compile (need {COMPILE_TARGET})"]
        if r.family == "block":
            parts.append(f"{_num(r.ratio('eager'), '.2f')}x eager")
        return f"{r.task} @ {r.shape}: " + ", ".join(parts)


def target_checks(run: BenchRun) -> list[TargetCheck]:
    return [
        TargetCheck(
            row=r, cublas_needed=CUBLAS_TARGET.get(r.family, CUBLAS_TARGET_DEFAULT),
            cublas_ratio=r.ratio("cublas"), compile_ratio=r.ratio("better_compile"),
        )
        for r in run.rows
        if r.shape.startswith(TARGET_SHAPE_PREFIXES)
    ]


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def markdown_summary(run: BenchRun) -> str:
    """The committed summary: provenance, one table per task, the targets, and every failure's reason."""
    pk = run.packages
    lines = [
        f"# Bench: human kernels on {run.device} ({run.created:%Y-%m-%d})",
        "",
        f"- command: `{run.command}`",
        f"- device: {run.device}, driver {run.driver or '?'}; git {run.git_commit or '?'}",
        "- packages: " + ", ".join(f"{k} {v}" for k, v in pk.items()),
        f"- measured peaks: {_num(run.peak_tflops_bf16, '.0f')} TFLOP/s bf16, {_num(run.peak_hbm_tbps, '.2f')} TB/s HBM"
        + (f" ({run.peaks_method})" if run.peaks_method else ""),
        f"- timing: {run.timing_method}",
        f"- correctness: gpu_correctness stage, {run.correctness_seeds} seeds per shape",
        f"- torch.compile baselines: mode {', '.join(run.compile_modes)} (static shapes)",
        "- ratios are baseline time / kernel time (above 1: the kernel is faster); cuBLAS = the task's GEMMs alone; "
        "x compile = against the faster of torch.compile's default and max-autotune-no-cudagraphs modes (those timed); "
        "% SoL = max(FLOPs / peak, min bytes / bandwidth) / kernel time",
        "",
    ]
    for task, rows in by_task(run.rows).items():
        lines += [f"## {task}" + (f" ({rows[0].family})" if rows[0].family else ""), "", _md_row(list(COLUMNS)),
                  _md_row(["---"] * len(COLUMNS))]
        lines += [_md_row(row_cells(r)) for r in rows]
        lines.append("")
    checks = target_checks(run)
    if checks:
        met = [c for c in checks if c.met]
        lines += [
            "## Targets (Llama-3 8B and CODA shapes)",
            "",
            f"{len(met)} of {len(checks)} rows meet both targets (>= {CUBLAS_TARGET_DEFAULT}x cuBLAS alone, "
            f">= {CUBLAS_TARGET['block']}x for blocks, and >= {COMPILE_TARGET}x torch.compile).",
            "",
        ]
        lines += [f"- {'met' if c.met else '**missed**'}: {c.describe()}" for c in checks]
        lines.append("")
    pending = [r for r in run.rows if r.pending]
    if pending:
        lines += [f"{len(pending)} correct rows are not timed yet: the bench stopped before their timing phase "
                  "(`coda-agent bench --resume` with the same `--json` carries on).", ""]
    failed = [r for r in run.rows if not r.correct]
    if failed:
        lines += ["## Failures", ""]
        lines += [f"- {r.task} @ {r.shape}: {r.verdict_reason.splitlines()[0] if r.verdict_reason else 'failed'}" for r in failed]
        lines.append("")
    return "\n".join(lines)
