"""What each part of gemm_rmsnorm_bwd's epilogue costs at the short-K dgrad row (issue 44).

At M 32768 x N 2048 x K 3072 (the Llama-3 1B stack's attention-block dgrad) QuACK's kernel runs it at 0.79-0.84x
cuBLAS on an H100 and an H200, and the load-ahead kernel at the tiles tried at 0.53-0.81x, while its plain twin (the
same GEMM with an empty epilogue) runs level with cuBLAS (``bench/notes/2026-12-05-epilogue-probes.md``, last
sections): the epilogue costs about 2 µs a subtile that the mainloop no longer hides. This probe times the epilogue
whole and then less one part at a time (C; the tile operand h; the vectors gamma, rstd, zdz; the extra output
normed; the dgamma reduce), plus D = acc alone and the empty twin, all on the product's path (kernel and config as
``gemm()`` picks them: the load-ahead kernel where the epilogue reads C or h, QuACK's where it reads neither),
beside cuBLAS, interleaved with the bench's protocol. The part whose removal recovers the most is the one to fix.

    source .gpu2/env.sh && python3 bench/probes/epilogue_cost.py --json .gpuwork/epilogue-cost.jsonl
    QUACK_ARCH=90 CUTE_DSL_ARCH=sm_90a python3 bench/probes/epilogue_cost.py --compile-only   # CPU: build each

Outputs differ between variants by construction; only the whole epilogue is checked, against the task's human
kernel, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from coda_agent.primitives import ColVecLoad, RowVecLoad, RowVecReduce, backend, epilogue, gemm
from coda_agent.tasks import find_task
from coda_agent.tasks.loader import import_file

VECTORS = {"gamma": RowVecLoad(), "rstd": ColVecLoad(), "zdz": ColVecLoad()}
DGAMMA = {"dgamma": RowVecReduce(scaled=True)}


@epilogue(outputs=("normed",), operands=VECTORS, reduces=DGAMMA)
def whole(acc, c, h, gamma, rstd, zdz, neg_inv_n):
    xhat = h * rstd
    return {"D": (acc * gamma + xhat * (zdz * neg_inv_n)) * rstd + c, "normed": xhat * gamma, "dgamma": (acc, xhat)}


@epilogue(outputs=("normed",), operands=VECTORS, reduces=DGAMMA)
def less_c(acc, h, gamma, rstd, zdz, neg_inv_n):
    xhat = h * rstd
    return {"D": (acc * gamma + xhat * (zdz * neg_inv_n)) * rstd, "normed": xhat * gamma, "dgamma": (acc, xhat)}


@epilogue(outputs=("normed",), operands=VECTORS, reduces=DGAMMA)
def less_h(acc, c, gamma, rstd, zdz, neg_inv_n):
    xhat = acc * rstd
    return {"D": (acc * gamma + xhat * (zdz * neg_inv_n)) * rstd + c, "normed": xhat * gamma, "dgamma": (acc, xhat)}


@epilogue(outputs=("normed",), reduces=DGAMMA)
def less_vectors(acc, c, h, neg_inv_n):
    return {"D": (acc + h * neg_inv_n) + c, "normed": h, "dgamma": (acc, h)}


@epilogue(operands=VECTORS, reduces=DGAMMA)
def less_normed(acc, c, h, gamma, rstd, zdz, neg_inv_n):
    xhat = h * rstd
    return {"D": (acc * gamma + xhat * (zdz * neg_inv_n)) * rstd + c, "dgamma": (acc, xhat)}


@epilogue(outputs=("normed",), operands=VECTORS)
def less_dgamma(acc, c, h, gamma, rstd, zdz, neg_inv_n):
    xhat = h * rstd
    return {"D": (acc * gamma + xhat * (zdz * neg_inv_n)) * rstd + c, "normed": xhat * gamma}


@epilogue()
def d_only(acc):
    return {"D": acc}


@epilogue()
def twin(acc):
    return {}


def variants(x: dict[str, torch.Tensor]) -> dict[str, Callable[[], Any]]:
    """Every variant's call on the task's inputs ``x`` (dz, w, h, gamma, rstd, zdz, dres)."""
    dz, w, h, dres = x["dz"], x["w"], x["h"], x["dres"]
    vec = {"gamma": x["gamma"], "rstd": x["rstd"], "zdz": x["zdz"]}
    scale = -1.0 / h.shape[1]
    return {
        "cublas": lambda: dz @ w,
        "twin (empty epilogue)": lambda: gemm(twin, dz, w),
        "D = acc": lambda: gemm(d_only, dz, w),
        "whole": lambda: gemm(whole, dz, w, C=dres, h=h, neg_inv_n=scale, **vec),
        "less C": lambda: gemm(less_c, dz, w, h=h, neg_inv_n=scale, **vec),
        "less h": lambda: gemm(less_h, dz, w, C=dres, neg_inv_n=scale, **vec),
        "less vectors": lambda: gemm(less_vectors, dz, w, C=dres, h=h, neg_inv_n=scale),
        "less normed": lambda: gemm(less_normed, dz, w, C=dres, h=h, neg_inv_n=scale, **vec),
        "less dgamma": lambda: gemm(less_dgamma, dz, w, C=dres, h=h, neg_inv_n=scale, **vec),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", action="append", default=[], help="M,N,K (repeatable; default 32768,2048,3072)")
    p.add_argument("--compile-only", action="store_true", help="build every variant for sm_90a on the CPU")
    p.add_argument("--json", help="append one JSON object per shape")
    args = p.parse_args()
    task = find_task("gemm_rmsnorm_bwd")
    human = import_file(task.human_file, "human")
    device = "cpu" if args.compile_only else "cuda"
    for spec in args.shape or ["32768,2048,3072"]:
        m, n, k = (int(v) for v in spec.split(","))
        x = task.make_inputs({"M": m, "N": n, "K": k}, seed=0, device=device)
        calls = variants(x)
        if args.compile_only:
            with backend.using("quack-compile"):
                for name, call in calls.items():
                    if name != "cublas":
                        t0 = time.time()
                        call()
                        print(f"built {name} at {spec}: {time.time() - t0:.1f} s", flush=True)
            continue
        from coda_agent.measure.timing import Clock, RepPlan, paired_ratio, time_interleaved

        with backend.using("quack"):
            want, got = human.forward(**x), calls["whole"]()
            torch.cuda.synchronize()
            same = {key: bool(torch.equal(want[key], got[name]))
                    for key, name in (("dh", "D"), ("normed", "normed"), ("dgamma", "dgamma"))}
            print(f"== M {m} N {n} K {k}: whole against the human kernel, bit for bit: {same}", flush=True)
            timings = time_interleaved(calls, Clock("cuda"), RepPlan(warmup=2, target_s=0.1, min_reps=15,
                                                                      max_reps=40))
        base = timings["cublas"]
        for name, timing in sorted(timings.items(), key=lambda kv: kv[1].median_us):
            print(f"  {timing.median_us:9.1f} us  p10 {timing.p10_us:9.1f}  p90 {timing.p90_us:9.1f}  {name}"
                  f"  {paired_ratio(base, timing):.3f}x cuBLAS", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"M,N,K": [m, n, k], "device": torch.cuda.get_device_name(0),
                                    "timings": {k: v.model_dump() for k, v in timings.items()}}) + "\n")


if __name__ == "__main__":
    main()
