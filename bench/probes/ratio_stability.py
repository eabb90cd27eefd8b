"""How far each way of forming a bench ratio moves between two whole-suite benches of the same kernels.

A bench row's ratio to cuBLAS or torch.compile can be formed from the rounds its results file keeps (one batch's
median per variant and round): the paired median (:func:`~coda_agent.measure.timing.paired_ratio`, the tables'
ratio) or each side's fastest round (:func:`~coda_agent.measure.timing.fastest_round_ratio`, the targets' ratio since
the nineteenth session). For the rows present in both files and not skipped (``--skip TASK`` or ``TASK@SHAPE``:
kernels that changed between the two commits), this prints, per baseline and way, the mean, 90th percentile and
largest change between the files, and the rows whose target verdict changed; then each file's count of rows meeting
both targets, by either way. Used for the choice in ``bench/results/h200-2026-12-03-c-notes.md``:

    python bench/probes/ratio_stability.py bench/results/h200-2026-12-02-h.json bench/results/h200-2026-12-03-c.json \\
        --skip gemm_swiglu_bwd --skip gemm_rmsnorm@ragged --skip gemm_cross_entropy@ragged --skip gemm_rmsnorm_gemm@ragged
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from coda_agent.bench.report import TargetCheck, target_checks
from coda_agent.bench.results import BenchRow, BenchRun

WAYS: dict[str, Callable[[BenchRow, str], float | None]] = {"paired median": BenchRow.ratio,
                                                              "fastest round": BenchRow.fastest_ratio}


def load(path: Path) -> BenchRun:
    return BenchRun.model_validate(json.loads(path.read_text()))


def checks_by(run: BenchRun, way: Callable[[BenchRow, str], float | None]) -> dict[tuple[str, str], TargetCheck]:
    """The target checks with both ratios formed ``way``."""
    return {(c.row.task, c.row.shape): replace(c, cublas_ratio=way(c.row, "cublas"), compile_ratio=way(c.row, "better_compile"))
            for c in target_checks(run)}


def skipped(key: tuple[str, str], skip: list[str]) -> bool:
    return key[0] in skip or f"{key[0]}@{key[1]}" in skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--skip", action="append", default=[], metavar="TASK[@SHAPE]", help="rows whose kernel changed")
    args = ap.parse_args()
    runs = [load(args.before), load(args.after)]
    for name, way in WAYS.items():
        a, b = (checks_by(run, way) for run in runs)
        keys = [k for k in a if k in b and not skipped(k, args.skip)]
        for baseline, field in (("cuBLAS", "cublas_ratio"), ("compile", "compile_ratio")):
            moves = sorted(abs(getattr(a[k], field) - getattr(b[k], field)) for k in keys
                           if getattr(a[k], field) is not None and getattr(b[k], field) is not None)
            if moves:
                print(f"{name:13s} x {baseline:7s} {len(moves)} rows: moved mean {statistics.mean(moves):.4f}, "
                      f"p90 {moves[int(0.9 * len(moves))]:.4f}, most {moves[-1]:.4f}")
        flips = [f"{k[0]}@{k[1]}" for k in keys if a[k].met != b[k].met]
        print(f"{name:13s} verdicts changed at {len(flips)} rows: {', '.join(flips) or '-'}")
    for path, run in zip((args.before, args.after), runs, strict=True):
        counts = {name: sum(c.met for c in checks_by(run, way).values()) for name, way in WAYS.items()}
        print(f"{path.name} ({(run.git_commit or '?')[:7]}): " + ", ".join(f"{n} met by the {name}" for name, n in counts.items())
              + f", of {len(run.rows)} rows")


if __name__ == "__main__":
    main()
