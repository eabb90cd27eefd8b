"""Which kernel cuBLAS runs at each bench GEMM shape, and its time: the config QuACK is measured against (issue 9).

cuBLAS names its SM90 kernels after their schedule (``nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT``: CTA tile,
K-tile x stages, cluster, cooperative or pingpong), so the profiler's kernel names say what cuBLAS chose where QuACK
trails it, the narrow-N, long-K and ragged rows. The same ``mm`` the bench's cuBLAS baseline calls (bf16, in the
layout the task's reference multiplies in, ``baselines.gemm_layouts``; a GEMM whose layout is not ``x @ w.T`` is
timed in that one too, so the two say whether the layout moves cuBLAS's time), one warm call, then ``--reps`` calls
under ``torch.profiler``, each after an L2 flush; CUDA time per kernel name. A probe, not the bench; GPU only:

    python3 bench/probes/cublas_kernels.py                          # every GEMM of every task's bench shapes
    python3 bench/probes/cublas_kernels.py --mnk 8192,2048,8192 --json cublas.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from coda_agent.measure.baselines import DEFAULT_LAYOUT, gemm_layouts
from coda_agent.tasks.loader import load_tasks

Shape = tuple[tuple[int, int, int], str]


def bench_shapes() -> dict[Shape, list[str]]:
    """Each (M, N, K) GEMM of the suite's bench shapes and its layout, with the task:shape rows that run it (and in
    the default layout too, where a task's is another)."""
    shapes: dict[Shape, list[str]] = defaultdict(list)
    for task in load_tasks():
        for point in task.shape("bench"):
            for mnk, layout in zip(task.gemm_shapes(point.dims), gemm_layouts(task), strict=True):
                shapes[(mnk, layout)].append(f"{task.name}:{point.name}")
                if layout != DEFAULT_LAYOUT:
                    shapes[(mnk, DEFAULT_LAYOUT)].append(f"{task.name}:{point.name} as {DEFAULT_LAYOUT}")
    return dict(shapes)


def probe(mnk: tuple[int, int, int], layout: str, reps: int) -> dict[str, float]:
    """CUDA µs per call of each kernel cuBLAS launched for the product ``layout`` names at ``mnk``."""
    m, n, k = mnk
    x = torch.randn((k, m) if layout.startswith("x.T") else (m, k), device="cuda", dtype=torch.bfloat16)
    w = torch.randn((n, k) if layout.endswith("w.T") else (k, n), device="cuda", dtype=torch.bfloat16)
    a, b = (x.t() if layout.startswith("x.T") else x), (w.t() if layout.endswith("w.T") else w)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    torch.mm(a, b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            torch.mm(a, b)
        torch.cuda.synchronize()
    times: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and "elementwise" not in event.name \
                and "fill" not in event.name.lower():
            times[event.name] += event.device_time / reps
    return dict(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnk", action="append", help="M,N,K, as x @ w.T (repeatable; default: every bench shape)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", help="append one JSON line per shape")
    args = parser.parse_args()
    given = [tuple(int(v) for v in s.split(",")) for s in args.mnk or ()]
    shapes = {((m, n, k), DEFAULT_LAYOUT): [] for m, n, k in given} if given else bench_shapes()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuBLAS {torch.backends.cuda.preferred_blas_library()}")
    for (mnk, layout), rows in sorted(shapes.items()):
        kernels = probe(mnk, layout, args.reps)
        label = f"{'x'.join(map(str, mnk))} {layout}"
        for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
            print(f"{label:>20}  {us:9.1f} µs  {name}   ({', '.join(rows)})")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"mnk": mnk, "layout": layout, "rows": rows, "kernels_us": kernels}) + "\n")


if __name__ == "__main__":
    main()
