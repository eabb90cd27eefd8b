"""How well the CPU's cost estimate (``coda_agent.verifier.cost``) ranks the hand-written kernels' measured H200 times.

For every row of a bench result (a task's human kernel at a bench shape, timed on the H200), run the kernel's
forward() on meta tensors at that shape under the runner's op log (what the verifier's compile stage records), price
it with the estimate under the bench's own measured peaks, and set the estimate beside the measured median:
Spearman's rank correlation over all rows, the same for the time over the speed of light (the harder test: size
alone does not decide it), Kendall's tau, and measured/estimate per row. No GPU needed.

    python bench/probes/cost_calibration.py bench/results/h200-2026-12-03-e.json --out bench/calibration/h200-2026-12-03-cost-calibration
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
from pathlib import Path

import torch

from coda_agent.measure.peaks import Peaks
from coda_agent.primitives import backend
from coda_agent.runner.serve import OpLog
from coda_agent.tasks import find_task
from coda_agent.tasks.loader import import_file
from coda_agent.tasks.model import torch_dtype
from coda_agent.verifier.cost import estimate


def ranks(xs: list[float]) -> list[float]:
    order = sorted(range(len(xs)), key=xs.__getitem__)
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for t in range(i, j + 1):
            r[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    return cov / (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5


def kendall(a: list[float], b: list[float]) -> float:
    n, s = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            s += ((a[i] > a[j]) - (a[i] < a[j])) * ((b[i] > b[j]) - (b[i] < b[j]))
    return 2 * s / (n * (n - 1))


def op_log(task_name: str, dims: dict[str, int]) -> list[dict]:
    task = find_task(task_name)
    assert task.human_file is not None
    human = import_file(task.human_file, f"calib_{task_name}")
    meta = {s.name: torch.empty(s.concrete_shape(dims), dtype=torch_dtype(s.dtype), device="meta") for s in task.inputs}
    log = OpLog()
    with torch.no_grad(), backend.using("shapes", wrap=log.wrap_backend), log, log.call():
        human.forward(**meta, **task.constants)
    return log.calls[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", type=Path)
    p.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = p.parse_args()
    bench = json.loads(args.bench.read_text())
    peaks = Peaks(tflops_bf16=bench["peak_tflops_bf16"], hbm_tbps=bench["peak_hbm_tbps"], how="the bench's measured peaks")
    rows = []
    for r in bench["rows"]:
        if r.get("author") != "human" or not r.get("correct") or not r.get("candidate"):
            continue
        task = find_task(r["task"])
        est = estimate(op_log(r["task"], r["dims"]), peaks, shape=r["shape"], sol_us=r["sol_us"], min_bytes=task.min_bytes(r["dims"]))
        rows.append({"task": r["task"], "shape": r["shape"], "measured_us": r["candidate"]["median_us"], "sol_us": r["sol_us"],
                     "estimate_us": est.total_us, "launches": est.launches, "dominant": est.dominant(), "estimate": est.to_json()})
    meas = [r["measured_us"] for r in rows]
    est_us = [r["estimate_us"] for r in rows]
    ratio = [m / e for m, e in zip(meas, est_us, strict=True)]
    meas_sol = [r["measured_us"] / r["sol_us"] for r in rows]
    est_sol = [r["estimate_us"] / r["sol_us"] for r in rows]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(), "git_commit": commit,
        "command": f"python bench/probes/cost_calibration.py {args.bench}" + (f" --out {args.out}" if args.out else ""),
        "bench": str(args.bench), "bench_commit": bench.get("git_commit"), "rows_used": len(rows),
        "spearman_time": spearman(est_us, meas), "kendall_time": kendall(est_us, meas),
        "spearman_over_sol": spearman(est_sol, meas_sol), "kendall_over_sol": kendall(est_sol, meas_sol),
        "measured_over_estimate": {"min": min(ratio), "median": statistics.median(ratio), "max": max(ratio)},
        "rows": rows,
    }
    lines = [
        f"# Cost estimate against the H200 bench ({args.bench.name})", "",
        f"Made {result['created'][:19]}Z at commit {commit[:10]} with `{result['command']}` (CPU only, the bench's peaks: "
        f"{peaks.tflops_bf16:.0f} TFLOP/s, {peaks.hbm_tbps:.2f} TB/s).", "",
        f"Over {len(rows)} rows (every correct human-kernel row of the bench):",
        f"- estimated vs measured time: Spearman {result['spearman_time']:.3f}, Kendall {result['kendall_time']:.3f};",
        f"- time over the speed of light, estimated vs measured: Spearman {result['spearman_over_sol']:.3f}, "
        f"Kendall {result['kendall_over_sol']:.3f};",
        f"- measured / estimate: {min(ratio):.2f}x to {max(ratio):.2f}x, median {statistics.median(ratio):.2f}x.", "",
        "| task | shape | measured µs | estimate µs | measured/est | SoL µs | launches | largest avoidable cost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, q in zip(rows, ratio, strict=True):
        lines.append(f"| {r['task']} | {r['shape']} | {r['measured_us']:.1f} | {r['estimate_us']:.1f} | {q:.2f} | "
                     f"{r['sol_us']:.1f} | {r['launches']} | {r['dominant']} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(text)
    print("\n".join(lines[:9]))


if __name__ == "__main__":
    main()
