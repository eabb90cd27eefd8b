"""Issue 44: the plain GEMM of gemm_swiglu_bwd at a cooperative 256x128 tile, with its A/B stages capped.

ncu at llama3-1b (H100, 2026-12-06-e, ``bench/results/h100-2026-12-06-e-ncu-ledger.txt``) found the human kernel at
256x128 cooperative latency-bound in its mainloop, not in its epilogue: the epilogue's buffers leave it 2 A/B
stages, 62.8% of the warps' samples wait for the next k-block, and DRAM runs at 34.6%. The structure proposed in
``bench/notes/2026-12-06-swiglu-bwd-next-structure.md`` (an epilogue warp group fed through shared memory) would
run this tile's mainloop at 3 stages beside a 64 KB hand-off. This probe says what such a mainloop costs: QuACK's
plain GEMM on the task's own operands (dy, and w_down as its N-major B) at 256x128 cooperative, with
``GemmSm90._compute_stages`` capped at each of ``--caps`` A/B stages, against cuBLAS (``torch.mm``) in the same
process, interleaved by the bench's clock.

Each cap runs in a process of its own with QuACK's disk cache off: the stage count is not part of QuACK's compile
key, so one process would reuse its first build. GPU only (``source .gpu2/env.sh``)::

    python3 bench/probes/stage_cap.py --row gemm_swiglu_bwd:llama3-1b --caps 4,3,2 --json stage-cap.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def child(spec: str, cap: int, tile: tuple[int, int], pingpong: bool) -> dict[str, Any]:
    """Time one cap against cuBLAS; the split QuACK ends up with is recorded from the patched method itself."""
    import torch
    from quack.gemm_config import GemmConfig
    from quack.gemm_interface import gemm_tuned
    from quack.gemm_sm90 import GemmSm90
    from schedule_probe import rows

    from coda_agent.measure.timing import Clock, RepPlan, fastest_round_ratio, paired_ratio, time_interleaved
    from coda_agent.tasks.loader import find_task

    splits: list[tuple[int, int, int]] = []
    quacks = GemmSm90._compute_stages.__func__

    def capped(cls: Any, *args: Any, **kwargs: Any) -> Any:
        ab, *rest = quacks(cls, *args, **kwargs)
        split = (min(ab, cap), *rest)
        splits.append(tuple(int(x) for x in split))
        return split

    GemmSm90._compute_stages = classmethod(capped)
    name, shape, dims = rows([spec])[0]
    inputs = find_task(name).make_inputs(dims, seed=0, device="cuda")
    a, b = inputs["dy"], inputs["w_down"]
    config = GemmConfig(tile_m=tile[0], tile_n=tile[1], cluster_m=2, cluster_n=1, pingpong=pingpong,
                        is_dynamic_persistent=True)
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)

    def twin() -> torch.Tensor:
        gemm_tuned.fn(a, b, out, dynamic_scheduler=True, config=config)  # past the autotuner: this config
        return out

    variants = {"cublas": lambda: torch.mm(a, b), "twin": twin}
    assert torch.allclose(twin().float(), torch.mm(a, b).float(), rtol=2e-2, atol=2e-2)
    timings = time_interleaved(variants, Clock("cuda"), RepPlan())
    return {"row": f"{name}:{shape}", "M,N,K": [a.shape[0], b.shape[1], a.shape[1]], "tile": list(tile),
            "pingpong": pingpong, "cap": cap, "split (ab, d, c)": splits[-1] if splits else None,
            "cublas_us": timings["cublas"].median_us, "twin_us": timings["twin"].median_us,
            "x cublas (paired)": paired_ratio(timings["cublas"], timings["twin"]),
            "x cublas (fastest rounds)": fastest_round_ratio(timings["cublas"], timings["twin"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--row", action="append", default=[], help="gemm_swiglu_bwd:shape or gemm_swiglu_bwd:DIM=N,...")
    p.add_argument("--caps", default="4,3,2", help="A/B stage caps, comma-separated (one process each)")
    p.add_argument("--tile", default="256,128", help="tile_m,tile_n (cooperative unless --pingpong)")
    p.add_argument("--pingpong", action="store_true")
    p.add_argument("--json", type=Path, help="append one JSON object per row and cap")
    p.add_argument("--child", nargs=2, metavar=("ROW", "CAP"), help=argparse.SUPPRESS)
    args = p.parse_args()
    tile = tuple(int(x) for x in args.tile.split(","))
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), tile, args.pingpong)), flush=True)
        return
    env = {**os.environ, "QUACK_CACHE_ENABLED": "0"}
    for spec in args.row or ["gemm_swiglu_bwd:llama3-1b"]:
        for cap in args.caps.split(","):
            cmd = [sys.executable, __file__, "--child", spec, cap, "--tile", args.tile]
            done = subprocess.run(cmd + (["--pingpong"] if args.pingpong else []), env=env, capture_output=True,
                                  text=True, timeout=300)
            if done.returncode:
                print(f"{spec} cap {cap}: exit {done.returncode}: {done.stderr.strip()[-400:]}", flush=True)
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(result), flush=True)
            if args.json:
                with args.json.open("a") as f:
                    f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
