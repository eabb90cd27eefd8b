"""Which kernel cuBLAS runs at each bench GEMM shape, and its time: the config QuACK is measured against (issue 9).

cuBLAS names its SM90 kernels after their schedule (``nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT``: CTA tile,
K-tile x stages, cluster, cooperative or pingpong), so the profiler's kernel names say what cuBLAS chose where QuACK
trails it, the narrow-N, long-K and ragged rows. The same ``mm`` the bench's cuBLAS baseline calls (bf16, B given
as the (N, K) weight transposed), one warm call, then ``--reps`` calls under ``torch.profiler``, each after an L2
flush; CUDA time per kernel name. A probe, not the bench; GPU only:

    python3 bench/probes/cublas_kernels.py                          # every GEMM of every task's bench shapes
    python3 bench/probes/cublas_kernels.py --mnk 8192,2048,8192 --json cublas.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from coda_agent.tasks.loader import load_tasks


def bench_shapes() -> dict[tuple[int, int, int], list[str]]:
    """Each (M, N, K) GEMM of the suite's bench shapes, with the task:shape rows that run it."""
    shapes: dict[tuple[int, int, int], list[str]] = defaultdict(list)
    for task in load_tasks():
        for point in task.shape("bench"):
            for mnk in task.gemm_shapes(point.dims):
                shapes[tuple(mnk)].append(f"{task.name}:{point.name}")  # type: ignore[index]
    return dict(shapes)


def probe(mnk: tuple[int, int, int], reps: int) -> dict[str, float]:
    """CUDA µs per call of each kernel cuBLAS launched for ``x @ w.t()`` at ``mnk``."""
    m, n, k = mnk
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    torch.mm(x, w.t())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            torch.mm(x, w.t())
        torch.cuda.synchronize()
    times: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and "elementwise" not in event.name \
                and "fill" not in event.name.lower():
            times[event.name] += event.device_time / reps
    return dict(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnk", action="append", help="M,N,K (repeatable; default: every bench shape)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", help="append one JSON line per shape")
    args = parser.parse_args()
    shapes = ({tuple(int(v) for v in s.split(",")): [] for s in args.mnk} if args.mnk else bench_shapes())
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuBLAS {torch.backends.cuda.preferred_blas_library()}")
    for mnk, rows in sorted(shapes.items()):
        kernels = probe(mnk, args.reps)  # type: ignore[arg-type]
        label = "x".join(map(str, mnk))
        for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
            print(f"{label:>20}  {us:9.1f} µs  {name}   ({', '.join(rows)})")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"mnk": mnk, "rows": rows, "kernels_us": kernels}) + "\n")


if __name__ == "__main__":
    main()
