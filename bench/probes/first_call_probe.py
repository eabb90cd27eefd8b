"""Issue 47: where a fresh process's first call of a kernel goes, QuACK's disk cache cold and warm.

On the H200 (2026-12-05-b) a correct attempt's ``gpu_correctness`` spent 10.6-17.9 s and its ``profile``
13.3-14.5 s in the candidate's warm-up, the first calls of a runner at the bench shape, although the second
stage found every kernel in the QuACK cache the first one filled. On the CPU's compile-only path a warm cache
saves only half of a first call (2.4 s of 5.5 s at gemm_residual_rmsnorm): the rest is not the compiler. This
probe splits the first call into its steps, in fresh processes one after another that share one QuACK cache
(the first finds it empty, the next ones full), each step timed on its own: import torch, CUDA's context, the
kernel module's import, a first call at the task's first small shape, a first call at its first bench shape, a
second call there; then cProfile of one more fresh process's first bench-shape call, the functions that take
its time by cumulative time.

    python3 bench/probes/first_call_probe.py gemm_residual_rmsnorm [--kernel FILE] [--runs 3] [--json OUT]

Two more questions, in the runner's conditions (its environment as ``sandbox.runner_env`` makes it: a fresh
HOME, XDG and Triton cache, no bytecode written; the user stays the probe's): is a warm process's first call
still slow there, and does a cache the CPU's compile-only path filled (``QUACK_ARCH=90``, no GPU visible,
the ``compile`` stage's backend) serve the GPU's first call, or does the GPU build every kernel again? The
number of cached objects after each process says which.

A task of the suite or a task YAML (``--kernel`` names the kernel file; by default the task's human kernel).
GPU only; run from the project root with the GPU environment (``source .gpu2/env.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP = r"""
import cProfile, importlib.util, io, json, pstats, sys, time
t = time.perf_counter()
import torch
steps = {"import torch": time.perf_counter() - t}
if sys.argv[3] != "compile":
    t = time.perf_counter(); torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    steps["CUDA context"] = time.perf_counter() - t
from coda_agent.primitives import backend
from coda_agent.tasks import find_task
task = find_task(sys.argv[1])
t = time.perf_counter()
spec = importlib.util.spec_from_file_location("candidate", sys.argv[2])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
compiling = sys.argv[3] == "compile"
device = "cpu" if compiling else "cuda"
backend.set_backend("quack-compile" if compiling else "quack")
steps["kernel import"] = time.perf_counter() - t
def call(point):
    inputs = task.make_inputs(point.dims, 0, device=device)
    if not compiling: torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.no_grad():
        mod.forward(**inputs, **task.constants)
    if not compiling: torch.cuda.synchronize()
    return time.perf_counter() - t
profiled = sys.argv[3] == "profile"
if not profiled:
    steps["first call, small shape"] = call(task.shape("small")[0])
bench = task.shape("bench")[0]
if profiled:
    prof = cProfile.Profile(); prof.enable()
steps["first call, bench shape"] = call(bench)
if profiled:
    prof.disable(); out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
    steps["profile"] = out.getvalue()
steps["second call, bench shape"] = call(bench)
print("STEPS " + json.dumps(steps))
"""


def run_step(task: str, kernel: Path, cache: Path, mode: str, runner_env: bool = False) -> dict[str, object]:
    """One fresh process's steps; ``runner_env``: in the runner's environment (module docstring)."""
    env = {**os.environ, "QUACK_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    if runner_env or mode == "compile":
        home = Path(tempfile.mkdtemp(prefix="first_call_home_"))
        env.update({"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "PYTHONDONTWRITEBYTECODE": "1",
                    "TRITON_CACHE_DIR": str(home / ".triton")})
    if mode == "compile":
        env.update({"QUACK_ARCH": "90", "CUTE_DSL_ARCH": "sm_90a", "CUDA_VISIBLE_DEVICES": ""})
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", STEP, task, str(kernel), mode], env=env, capture_output=True,
                          text=True, timeout=900)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("STEPS ")), None)
    if line is None:
        raise SystemExit(f"the probe's process failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    steps: dict[str, object] = json.loads(line[len("STEPS "):])
    steps["process"] = time.perf_counter() - t0
    steps["cached objects"] = len(list(cache.rglob("*.o")))
    return steps


def show(label: str, steps: dict[str, object]) -> None:
    print(f"{label}: " + ", ".join(f"{k} {v:.2f} s" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in steps.items() if k != "profile"), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task", help="a suite task's name or a task YAML")
    ap.add_argument("--kernel", type=Path, help="the kernel file (default: the task's human kernel)")
    ap.add_argument("--runs", type=int, default=3,
                    help="fresh processes on one cache (the first finds it cold)")
    ap.add_argument("--json", type=Path, help="write every run's steps here")
    args = ap.parse_args()
    from coda_agent.tasks import find_task

    task = find_task(args.task)
    kernel = args.kernel or task.human_file
    if kernel is None:
        raise SystemExit(f"{task.name} has no human kernel: name one with --kernel")
    runs = []
    with tempfile.TemporaryDirectory(prefix="first_call_quack_") as cache, \
            tempfile.TemporaryDirectory(prefix="first_call_cpu_built_") as cpu_built:
        for i in range(args.runs):
            steps = run_step(args.task, kernel, Path(cache), "steps")
            runs.append({"run": f"{'cold' if i == 0 else 'warm'} cache", **steps})
            show(f"run {i + 1} ({'cold' if i == 0 else 'warm'} cache)", steps)
        steps = run_step(args.task, kernel, Path(cache), "steps", runner_env=True)
        runs.append({"run": "warm cache, the runner's environment", **steps})
        show("warm cache, the runner's environment", steps)
        steps = run_step(args.task, kernel, Path(cpu_built), "compile")
        runs.append({"run": "the CPU's compile-only path, cold cache", **steps})
        show("the CPU's compile-only path (QUACK_ARCH=90, no GPU), cold cache", steps)
        steps = run_step(args.task, kernel, Path(cpu_built), "steps", runner_env=True)
        runs.append({"run": "GPU after the compile-only path, the runner's environment", **steps})
        show("the GPU on the cache the compile-only path filled, the runner's environment", steps)
        profiled = run_step(args.task, kernel, Path(cache), "profile", runner_env=True)
    first = profiled["first call, bench shape"]
    print(f"a warm process's first bench-shape call under cProfile, runner's environment ({first:.2f} s):")
    print(profiled.pop("profile"))
    runs.append({"run": "warm cache, the runner's environment, under cProfile", **profiled})
    if args.json:
        report = {"task": task.name, "kernel": str(kernel), "runs": runs}
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
