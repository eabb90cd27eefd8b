"""Which three-warp-group kernels never finish on the GPU (issues 44, 45), one variant per process, each under a
timeout.

On an H100 (bench/results/h100-2026-12-05-d-three-groups-timeout.log) every three-group variant of the schedule
probe ran past 240 s without a word. That held for the probe's 192x192 and QuACK's own cooperative 192x128, on
either kernel. Every two-group variant finished in seconds. This probe asks one question at a time: a plain GEMM
(no epilogue) or a human kernel, at 192x128 cooperative against 128x256 cooperative as the control, with QuACK's
dynamic persistent scheduler or its static one. It builds first and launches second, timing each step, so a
hang names the step too.

    source .gpu2/env.sh && python3 bench/probes/hang_probe.py --timeout 60
    source .gpu2/env.sh && python3 bench/probes/hang_probe.py --bisect --timeout 45   # which epilogue feature
    source .gpu2/env.sh && python3 bench/probes/hang_probe.py --leave-one-out --timeout 60   # which combination

On the H200 (2026-12-05-c) the plain 192x128 cooperative GEMM finished with either scheduler and gemm_rmsnorm_bwd's
did not; ``--bisect`` runs its epilogue's features one at a time (C, a tile operand, row and column vectors, an
extra output, a reduction down the columns and one across the rows). On an H100 (2026-12-05-e) every one of them
finished alone, so ``--leave-one-out`` runs the whole epilogue, at 4096^3 and at the task's small shape, and then
less one part at a time. ``CODA_HANG_PROBE_BACKEND=quack-compile`` with
``QUACK_ARCH=90 CUTE_DSL_ARCH=sm_90a`` builds the same kernels on a CPU without launching them.
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

#: gemm_rmsnorm_bwd's epilogue one feature at a time (``--bisect``), at 192x128 cooperative on QuACK's kernel:
#: on the H200 the plain GEMM finished there and gemm_rmsnorm_bwd did not (bench/results/h200-2026-12-05-c-hang.log),
#: and the CPU builds its kernel in 11.5 s, so a feature's launch hangs. Each name is an epilogue of CHILD's.
FEATURES = ["c", "tile_operand", "row_col_vectors", "extra_output", "row_vec_reduce", "col_vec_reduce"]
BISECT = [(f"epilogue with {name.replace('_', ' ')} 192x128 coop on QuACK's kernel, dynamic", f"epi:{name}",
           {"tile_m": 192, "tile_n": 128, "pingpong": False, "load_ahead": False}, True) for name in FEATURES]

#: On an H100 (bench/results/h100-2026-12-05-e-hang.log) each of those features alone finished at 4096^3 in 9-12 s.
#: ``--leave-one-out`` runs gemm_rmsnorm_bwd's whole epilogue at 4096^3 and at the task's small shape, then the
#: whole epilogue less one of its parts at a time (C; the tile operand h; the vectors gamma, rstd, zdz; the
#: extra output normed; the scaled dgamma reduce): a hang that needs two features, or the small shape, shows here.
PARTS = ["c", "h", "vectors", "normed", "dgamma"]
LEAVE_ONE_OUT = [(f"rms_bwd epilogue{' less ' + part if part else ''}{' at the small shape' if small else ''} "
                  "192x128 coop on QuACK's kernel, dynamic", f"rms:{part}:{'small' if small else 'big'}",
                  {"tile_m": 192, "tile_n": 128, "pingpong": False, "load_ahead": False}, True)
                 for part, small in [("", False), ("", True), *((p, False) for p in PARTS)]]

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
import os
from coda_agent.primitives import ColVecLoad, ColVecReduce, RowVecLoad, RowVecReduce
kind = os.environ.get("CODA_HANG_PROBE_BACKEND", "quack")
device = "cuda" if kind == "quack" else "cpu"
a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
t = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
vec = torch.rand(4096, device=device, dtype=torch.float32)
if task_name == "plain":
    @epilogue()
    def bare(acc):
        return {}
    step = lambda: gemm(bare, a, b, config=tile)
elif task_name == "epi:c":
    @epilogue()
    def with_c(acc, c):
        return {"D": acc + c}
    step = lambda: gemm(with_c, a, b, C=t, config=tile)
elif task_name == "epi:tile_operand":
    @epilogue()
    def with_tile(acc, h):
        return {"D": acc * h}
    step = lambda: gemm(with_tile, a, b, h=t, config=tile)
elif task_name == "epi:row_col_vectors":
    @epilogue(operands={"gamma": RowVecLoad(), "rstd": ColVecLoad()})
    def with_vectors(acc, gamma, rstd):
        return {"D": acc * gamma * rstd}
    step = lambda: gemm(with_vectors, a, b, gamma=vec, rstd=vec, config=tile)
elif task_name == "epi:extra_output":
    @epilogue(outputs=("twice",))
    def with_output(acc):
        return {"D": acc, "twice": acc + acc}
    step = lambda: gemm(with_output, a, b, config=tile)
elif task_name == "epi:row_vec_reduce":
    @epilogue(reduces={"colsum": RowVecReduce()})
    def with_row_reduce(acc):
        return {"D": acc, "colsum": acc}
    step = lambda: gemm(with_row_reduce, a, b, config=tile)
elif task_name == "epi:col_vec_reduce":
    @epilogue(reduces={"rowsum": ColVecReduce()})
    def with_col_reduce(acc):
        return {"D": acc, "rowsum": acc}
    step = lambda: gemm(with_col_reduce, a, b, config=tile)
elif task_name.startswith("rms:"):
    # gemm_rmsnorm_bwd's epilogue (coda_agent/suite/human/gemm_rmsnorm_bwd.py), less one part
    _, drop, size = task_name.split(":")
    if size == "small":
        m, n, k = 256, 384, 128  # the task's tiny shape (dz: M x K, w: K x N as the task passes it)
        a, t = a[:m, :k].contiguous(), t[:m, :n].contiguous()
        b, vec, rows = b[:k, :n].contiguous(), vec[:n].contiguous(), vec[:m].contiguous()
    else:
        rows = vec
    h = "acc" if drop == "h" else "h"
    scale = ("" if drop == "vectors" else " * gamma", "" if drop == "vectors" else " * rstd",
             "" if drop == "vectors" else " * zdz")
    body = [f"xhat = {h}{scale[1]}",
            f"d = (acc{scale[0]} + xhat{scale[2]} * neg_inv_n){scale[1]}" + ("" if drop == "c" else " + c")]
    ret = ['"D": d'] + ([] if drop == "normed" else [f'"normed": xhat{scale[0]}']) + (
        [] if drop == "dgamma" else ['"dgamma": (acc, xhat)'])
    args = ["acc"] + ([] if drop == "c" else ["c"]) + ([] if drop == "h" else ["h"]) + (
        [] if drop == "vectors" else ["gamma", "rstd", "zdz"]) + ["neg_inv_n"]
    src = (f"def rms_bwd({', '.join(args)}):\\n" + "".join(f"    {line}\\n" for line in body)
           + f"    return {{{', '.join(ret)}}}\\n")
    scope = {}
    exec(src, scope)
    fn = epilogue(outputs=() if drop == "normed" else ("normed",),
                  operands={} if drop == "vectors" else {"gamma": RowVecLoad(), "rstd": ColVecLoad(),
                                                          "zdz": ColVecLoad()},
                  reduces={} if drop == "dgamma" else {"dgamma": RowVecReduce(scaled=True)})(scope["rms_bwd"])
    kw = {"neg_inv_n": -1.0 / b.shape[1]}
    if drop != "c":
        kw["C"] = t
    if drop != "h":
        kw["h"] = t
    if drop != "vectors":
        kw.update(gamma=vec, rstd=rows, zdz=rows)
    print(json.dumps({"epilogue": src}), flush=True)
    step = lambda: gemm(fn, a, b, config=tile, **kw)
else:
    from coda_agent.tasks import find_task
    from coda_agent.tasks.loader import import_file
    task = find_task(task_name)
    human = import_file(task.human_file, "human")
    inputs = task.make_inputs(dict(task.shapes["small"][0].dims), seed=0, device=device)
    step = lambda: human.forward(**inputs, **task.constants)
with backend.using(kind, wrap=forced):
    for what in ("build and first launch", "second launch"):
        t0 = time.time()
        print(json.dumps({"step": what, "starting": True}), flush=True)
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        print(json.dumps({"step": what, "s": round(time.time() - t0, 2)}), flush=True)
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timeout", type=float, default=60.0, help="seconds each variant may take")
    p.add_argument("--bisect", action="store_true", help="gemm_rmsnorm_bwd's epilogue features one at a time")
    p.add_argument("--leave-one-out", action="store_true",
                   help="gemm_rmsnorm_bwd's whole epilogue, then less one part at a time")
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    for label, task, fields, dynamic in BISECT if args.bisect else LEAVE_ONE_OUT if args.leave_one_out else VARIANTS:
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
