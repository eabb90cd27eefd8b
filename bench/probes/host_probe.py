"""Issue 9's host-cost probe: how long each human kernel's forward() takes on the host per call, and where it goes.

At 666e628 the bench timed some short rows host-bound (gemm_rmsnorm at llama3-1b-qkv: 484 µs against a 134 µs
kernel; the runner's wall clock per call agreed), while ``schedule_probe.py`` timed the same kernels in process at
their GPU time. This probe measures the host side alone, with the GPU kept busy by a long device sleep ahead of
every batch so the host never waits for it, in these settings:

- ``plain``: forward() in process, as ``schedule_probe.py`` runs it;
- ``backend``: of that, the time inside the QuACK backend (``_quack.run``: the plan lookup, buffers, launch);
- ``op log``: forward() under the runner's op log (a TorchDispatchMode) and ``torch.no_grad``, both entered once
  around all the calls, as the runner enters them around a batch (until 2026-12-02's twelfth session the probe
  entered them around each call, and the column ran 30-150 µs above ``plain`` on the H200, where a cProfile run
  with the mode entered once showed forward() costing what it cost plain)
  (every setting goes through the op log's backend wrapper, which only records while a call is logged);
- ``after profiler``: ``plain`` again after one ``torch.profiler`` CUDA session in this process (the runner traces
  some batches: whether CUPTI, which Kineto leaves attached unless ``TEARDOWN_CUPTI=1``, slows every later launch);
- ``after teardown``: ``plain`` again after one more session that ends with ``TEARDOWN_CUPTI=1`` set;
- ``calib``: a fixed host workload (Python calls and small tensor allocations, no kernel) timed the same way beside
  each row: whether the machine, rather than the code, is slower at that moment;
- ``--profile N``: instead of the columns, cProfile of ``plain`` and ``op log`` at each row (N calls each, the GPU
  kept busy ahead), the functions that take the host's time, by own time and by cumulative time;
- ``--in-process``: only the first four (calib, plain, backend, op log): an A/B of two trees' host code, one after
  the other with the other tree first on PYTHONPATH;
- ``--per-cpu``: the calibration alone in two fresh processes pinned to each CPU in turn: whether a process's host
  speed follows the CPU it runs on (this microVM's vCPUs are host threads) or differs between processes on one CPU;
- ``runner``: forward() in the sandboxed runner, in the bench's untraced batches (its ``host_us``, which the bench
  keeps as ``host_median_us``), before and after one traced batch, without and with ``TEARDOWN_CUPTI=1`` in the
  runner's environment.

Run it after a bench's check phase on the same machine: the runner builds its kernels in the QuACK cache of the
kernel's source, which that phase fills. A probe, not the bench; GPU only, with the project root on PYTHONPATH
(``source .gpu2/env.sh``):

    python3 bench/probes/host_probe.py                      # the rows of DEFAULT_ROWS
    python3 bench/probes/host_probe.py --row gemm_rmsnorm:llama3-1b-qkv --json host.jsonl
    python3 bench/probes/host_probe.py --cpu --row gemm_rmsnorm   # the probe itself on the emulator (no GPU)
    python3 bench/probes/host_probe.py --per-cpu --row gemm_rmsnorm  # and the calibration on every CPU, pinned
    python3 bench/probes/host_probe.py --profile 300 --row gemm_rope:llama3-1b-qkv  # where forward()'s host time goes
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from coda_agent.primitives import backend
from coda_agent.runner.serve import OpLog
from coda_agent.tasks.loader import find_task, import_file
from coda_agent.verifier import Plan
from coda_agent.verifier.stages import Context

#: Device cycles of the sleep ahead of each batch (~20 ms on an H200): longer than the batch's host time.
AHEAD_CYCLES = 40_000_000
BATCH = 10
BATCHES = 5
#: The rows the sixth session timed host-bound (bench/README.md), and two with more host ops per forward().
DEFAULT_ROWS = ("gemm_rmsnorm:llama3-1b-qkv", "gemm_residual_rmsnorm:llama3-1b-down", "gemm_residual:ragged",
                "gemm_rmsnorm_cross_entropy_bwd:ragged")
INSIDE_BACKEND: list[float] = []
#: ``--cpu`` (a smoke run of the probe itself: the emulator at the small shapes) or the GPU.
DEVICE = "cuda"


def device_name() -> str:
    return torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _timed_backend(run: Callable[..., Any]) -> Callable[..., Any]:
    def go(call: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return run(call)
        finally:
            INSIDE_BACKEND.append(time.perf_counter() - t0)
    return go


def host_us(call: Callable[[], Any]) -> tuple[float, float]:
    """Median host µs per call of ``call``, and of the QuACK backend inside it, with the GPU busy ahead."""
    per_call, inside = [], []
    for _ in range(BATCHES):
        _sync()
        if DEVICE == "cuda":
            torch.cuda._sleep(AHEAD_CYCLES)
        for _ in range(BATCH):
            INSIDE_BACKEND.clear()
            t0 = time.perf_counter()
            call()
            per_call.append(time.perf_counter() - t0)
            inside.append(sum(INSIDE_BACKEND))
        _sync()
    return statistics.median(per_call) * 1e6, statistics.median(inside) * 1e6


def calibration() -> None:
    """A fixed host workload like forward()'s own Python: calls, dict work and a few small device allocations."""
    table: dict[int, int] = {}
    for i in range(200):
        table[i] = len(str(i))
    for _ in range(4):
        torch.empty(64, device=DEVICE)


def pinned_calibration_us(cpu: int) -> float:
    """The calibration in a fresh process pinned to ``cpu`` (µs per call)."""
    out = subprocess.run(
        [sys.executable, __file__, "--calibrate-on", str(cpu), *(["--cpu"] if DEVICE == "cpu" else [])],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout
    return float(out.split()[-1])


def per_cpu() -> dict[int, list[float]]:
    """Two fresh processes per CPU this one may run on, each pinned there, timing the calibration."""
    return {cpu: [pinned_calibration_us(cpu) for _ in range(2)] for cpu in sorted(os.sched_getaffinity(0))}


def rows(specs: list[str], shape_set: str) -> list[tuple[str, str, dict[str, int]]]:
    """``task`` (its first shape) or ``task:shape``; none: :data:`DEFAULT_ROWS`."""
    found = []
    for spec in specs:
        name, _, shape = spec.partition(":")
        points = find_task(name).shapes[shape_set]
        point = next((p for p in points if p.name == shape), None) if shape else points[0]
        if point is None:
            raise SystemExit(f"{name} has no bench shape {shape!r}")
        found.append((name, point.name, dict(point.dims)))
    return found


def probe_row(task_name: str, dims: dict[str, int], oplog: OpLog) -> dict[str, float]:
    task = find_task(task_name)
    assert task.human_file is not None
    human = import_file(task.human_file, f"host_probe_{task_name}")
    kwargs = {**task.make_inputs(dims, seed=0, device=DEVICE), **task.constants}

    def plain() -> Any:
        return human.forward(**kwargs)

    def logged() -> Any:
        with oplog.call():
            return human.forward(**kwargs)

    for _ in range(3):  # builds the kernels and plans
        plain()
    _sync()
    forward_us, backend_us = host_us(plain)
    with torch.no_grad(), oplog:  # entered once, around every call, as the runner enters it around a batch
        for _ in range(3):
            logged()
        logged_us, _ = host_us(logged)
    oplog.calls.clear()
    calib_us, _ = host_us(calibration)
    return {"plain_us": forward_us, "backend_us": backend_us, "oplog_us": logged_us, "calib_us": calib_us}


def profile_row(task_name: str, dims: dict[str, int], oplog: OpLog, calls: int) -> str:
    """cProfile of forward() plain and under the op log, ``calls`` calls each in batches behind a device sleep: the
    top functions by own time and by cumulative time (cProfile's own cost inflates many small calls alike)."""
    task = find_task(task_name)
    assert task.human_file is not None
    human = import_file(task.human_file, f"host_profile_{task_name}")
    kwargs = {**task.make_inputs(dims, seed=0, device=DEVICE), **task.constants}

    def logged() -> Any:
        with oplog.call():
            return human.forward(**kwargs)

    report = io.StringIO()
    with torch.no_grad():
        for label, call, mode in (("plain", lambda: human.forward(**kwargs), nullcontext()), ("op log", logged, oplog)):
            with mode:
                for _ in range(3):  # builds the kernels and plans
                    call()
                profiler = cProfile.Profile()
                for _ in range(-(-calls // BATCH)):
                    _sync()
                    if DEVICE == "cuda":
                        torch.cuda._sleep(AHEAD_CYCLES)
                    profiler.enable()
                    for _ in range(BATCH):
                        call()
                    profiler.disable()
                oplog.calls.clear()
            _sync()
            for order in ("tottime", "cumulative"):
                report.write(f"--- {task_name} {label}: {order}, {-(-calls // BATCH) * BATCH} calls\n")
                stats = pstats.Stats(profiler, stream=report)
                stats.sort_stats(order).print_stats(28)
    return report.getvalue()


def runner_us(task_name: str, shape: str, dims: dict[str, int], teardown: bool = False) -> dict[str, float]:
    """Median host µs per forward() in the sandboxed runner, in untraced batches as the bench times them: before
    any traced batch, and after one (the bench's runner traces every other batch). ``teardown``: Kineto finalizes
    CUPTI when each traced batch's profiler stops (``TEARDOWN_CUPTI=1``), else it leaves it attached (``0``, Kineto's
    default and the runner's)."""
    task = find_task(task_name)
    assert task.human_file is not None
    ctx = Context(task=task, source=task.human_file.read_text(), plan=Plan(shape_names=[shape], seeds=[0]),
                  deadline=time.monotonic() + 600)
    saved = os.environ.get("TEARDOWN_CUPTI")
    os.environ["TEARDOWN_CUPTI"] = "1" if teardown else "0"  # the runner inherits it (``sandbox.PASS_ENV``)
    try:
        with ctx.runner("torch" if DEVICE == "cpu" else "quack", DEVICE) as client:
            client.put("probe", task.make_inputs(dims, seed=0, device=DEVICE))

            def untraced() -> float:
                return statistics.median(
                    h for _ in range(BATCHES) for h in client.run(["probe"] * BATCH, keep=[], trace=False).host_us)

            def traced_kernels() -> float:
                """Kernels in a traced batch's trace: a finalized CUPTI must still trace the next batch whole."""
                trace = client.run(["probe"] * BATCH, keep=[], trace=True).trace or {}
                return sum(1 for e in trace.get("traceEvents", []) if e.get("cat") == "kernel")

            for _ in range(2):  # the warm-up: kernels, plans
                client.run(["probe"] * BATCH, keep=[], trace=False)
            before = untraced()
            kernels = [traced_kernels()]
            after = untraced()
            kernels.append(traced_kernels())  # the second session: CUPTI set up again after a teardown
            client.drop(["probe"])
    finally:
        if saved is None:
            os.environ.pop("TEARDOWN_CUPTI", None)
        else:
            os.environ["TEARDOWN_CUPTI"] = saved
    prefix = "runner_teardown" if teardown else "runner"
    return {f"{prefix}_us": before, f"{prefix}_after_trace_us": after,
            f"{prefix}_kernels_traced": kernels[0], f"{prefix}_kernels_retraced": kernels[1]}


def after_sessions(jobs: list[tuple[str, str, dict[str, int]]], results: dict[tuple[str, str], dict[str, float]],
                   oplog: OpLog, cpu: bool) -> None:
    """The columns after a profiler session, after one that tears CUPTI down, and in the sandboxed runner."""
    activity = torch.profiler.ProfilerActivity.CPU if cpu else torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[activity]):  # as a traced batch does
        for t, _, d in jobs[:1]:
            probe_row(t, d, oplog)
    for t, s, d in jobs:
        results[(t, s)]["after_profiler_us"] = probe_row(t, d, oplog)["plain_us"]
    os.environ["TEARDOWN_CUPTI"] = "1"  # Kineto reads it when a profiler stops: this session finalizes CUPTI
    with torch.profiler.profile(activities=[activity]):
        for t, _, d in jobs[:1]:
            probe_row(t, d, oplog)
    del os.environ["TEARDOWN_CUPTI"]
    for t, s, d in jobs:
        results[(t, s)]["after_teardown_us"] = probe_row(t, d, oplog)["plain_us"]
        results[(t, s)].update(runner_us(t, s, d))
        results[(t, s)].update(runner_us(t, s, d, teardown=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--row", action="append", default=[], help="task or task:shape (repeatable; default: every task)")
    p.add_argument("--json", type=Path, help="append one JSON object per row")
    p.add_argument("--cpu", action="store_true", help="a smoke run of the probe: the emulator, the small shapes")
    p.add_argument("--per-cpu", action="store_true", help="also the calibration in fresh processes pinned to each CPU")
    p.add_argument("--in-process", action="store_true",
                   help="only the in-process columns (calib, plain, backend, oplog): an A/B of two trees' host code")
    p.add_argument("--profile", type=int, metavar="N", help="cProfile N calls of each row, plain and logged, instead")
    p.add_argument("--calibrate-on", type=int, help=argparse.SUPPRESS)  # a --per-cpu child: pin, calibrate, print
    args = p.parse_args()
    global DEVICE
    DEVICE = "cpu" if args.cpu else "cuda"
    if args.calibrate_on is not None:
        os.sched_setaffinity(0, {args.calibrate_on})
        torch.empty(1, device=DEVICE)  # the device's context, outside the timing
        print(f"{host_us(calibration)[0]:.1f}")
        return
    oplog = OpLog()  # its backend wrapper too, as the runner's: the backend's own host ops skip the log
    backend.set_backend("torch" if args.cpu else "quack", wrap=lambda run: oplog.wrap_backend(_timed_backend(run)))
    jobs = rows(args.row or ([] if args.cpu else list(DEFAULT_ROWS)), "small" if args.cpu else "bench")
    if args.profile:
        for t, _, d in jobs:
            print(profile_row(t, d, oplog, args.profile))
        return
    results = {(t, s): probe_row(t, d, oplog) for t, s, d in jobs}
    columns: tuple[str, ...] = ("calib", "plain", "backend", "oplog")
    if not args.in_process:
        after_sessions(jobs, results, oplog, args.cpu)
        columns += ("after_profiler", "after_teardown", "runner", "runner_after_trace", "runner_teardown",
                    "runner_teardown_after_trace")
    print(f"{'task':32} {'shape':16} " + " ".join(f"{c:>{max(8, len(c))}}" for c in columns) + "  (host µs per call)")
    for (t, s), r in results.items():
        kernels = ", ".join(f"{r[k]:.0f}" for k in sorted(r) if "kernels" in k)
        print(f"{t:32} {s:16} " + " ".join(f"{r[c + '_us']:{max(8, len(c))}.1f}" for c in columns)
              + (f"  kernels per traced batch: {kernels}" if kernels else ""))
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps({"task": t, "shape": s, "device": device_name(), **r}) + "\n")
    if args.per_cpu:
        pinned = per_cpu()
        print("calibration in fresh processes pinned to one CPU (µs per call, two processes each):")
        print("  " + "; ".join(f"cpu {cpu}: {a:.1f}, {b:.1f}" for cpu, (a, b) in pinned.items()))
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps({"per_cpu_calib_us": {str(c): v for c, v in pinned.items()}, "device": device_name()}) + "\n")

if __name__ == "__main__":
    main()
