"""Which three-warp-group kernels never finish on the GPU (issues 44, 45), one variant per process, each under a
timeout.

On an H100 (bench/results/h100-2026-12-05-d-three-groups-timeout.log) every three-group variant of the schedule
probe ran past 240 s without a word. That held for the probe's 192x192 and QuACK's own cooperative 192x128, on
either kernel. Every two-group variant finished in seconds. This probe asks one question at a time: a plain GEMM
(no epilogue) or a human kernel, at 192x128 cooperative against 128x256 cooperative as the control, with QuACK's
dynamic persistent scheduler or its static one. It builds first and launches second, timing each step, so a
hang names the step too.

    source .gpu2/env.sh && python3 bench/probes/hang_probe.py --timeout 60
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

#: (label, task or "plain", tile fields, dynamic scheduler)
VARIANTS = [
    ("control: plain 128x256 coop, dynamic", "plain", {"tile_m": 128, "tile_n": 256, "pingpong": False}, True),
    ("plain 192x128 coop, dynamic", "plain", {"tile_m": 192, "tile_n": 128, "pingpong": False}, True),
    ("plain 192x128 coop, static", "plain", {"tile_m": 192, "tile_n": 128, "pingpong": False}, False),
    ("gemm_rmsnorm_bwd 192x128 coop on QuACK's kernel, dynamic", "gemm_rmsnorm_bwd",
     {"tile_m": 192, "tile_n": 128, "pingpong": False, "load_ahead": False}, True),
    ("gemm_rmsnorm_bwd 192x128 coop on QuACK's kernel, static", "gemm_rmsnorm_bwd",
     {"tile_m": 192, "tile_n": 128, "pingpong": False, "load_ahead": False}, False),
]

#: One variant, in a process of its own: build (the first call), then a second call, each timed.
CHILD = """
import dataclasses, json, sys, time
import torch
from coda_agent.primitives import _quack, backend, configs, epilogue, gemm
task_name, fields, dynamic = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
configs.DYNAMIC_SCHEDULER = dynamic
_quack.DYNAMIC_SCHEDULER = dynamic
_quack._gemm_config.cache_clear()
tile = configs.config_from_fields(fields)
forced = lambda run: lambda call: run(dataclasses.replace(call, config=tile, pinned=None))
if task_name == "plain":
    @epilogue()
    def bare(acc):
        return {}
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    step = lambda: gemm(bare, a, b, config=tile)
else:
    from coda_agent.tasks import find_task
    from coda_agent.tasks.loader import import_file
    task = find_task(task_name)
    human = import_file(task.human_file, "human")
    inputs = task.make_inputs(dict(task.shapes["small"][0].dims), seed=0, device="cuda")
    step = lambda: human.forward(**inputs, **task.constants)
with backend.using("quack", wrap=forced):
    for what in ("build and first launch", "second launch"):
        t0 = time.time()
        print(json.dumps({"step": what, "starting": True}), flush=True)
        step()
        torch.cuda.synchronize()
        print(json.dumps({"step": what, "s": round(time.time() - t0, 2)}), flush=True)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timeout", type=float, default=60.0, help="seconds each variant may take")
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    for label, task, fields, dynamic in VARIANTS:
        t0 = time.time()
        try:
            res = subprocess.run([sys.executable, "-c", CHILD, task, json.dumps(fields), "1" if dynamic else "0"],
                                 capture_output=True, text=True, timeout=args.timeout, env=env)
            steps = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
            verdict = f"exit {res.returncode}" + (f": {res.stderr.strip().splitlines()[-1][:200]}"
                                                   if res.returncode and res.stderr.strip() else "")
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            steps = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            verdict = f"TIMED OUT after {args.timeout:.0f} s"
        done = [f"{s['step']} {s['s']} s" for s in steps if "s" in s]
        stuck = [s["step"] for s in steps if s.get("starting")][len(done):]
        print(f"{label}: {verdict} in {time.time() - t0:.1f} s; done: {', '.join(done) or 'nothing'}"
              + (f"; stuck in: {stuck[0]}" if stuck and "TIMED" in verdict else ""), flush=True)


if __name__ == "__main__":
    main()
