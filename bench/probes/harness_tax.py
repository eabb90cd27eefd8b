"""The host cost per forward() of the Python around the kernels, measured on a CPU (issue 9's host-bound rows).

On the H200 (``host_probe.py``, 2026-12-02) the sandboxed runner spent 185-680 µs of host time per forward() of the
human kernels, of which QuACK's launch path is 54-177 µs: the rest is this package's own Python (``gemm()``'s checks,
the backend's buffers) and the runner's op log. None of that needs a GPU, so this probe times it here, with a
backend that computes nothing (each gemm call returns buffers made once per call shape), three ways:

- ``primitives``: forward() alone;
- ``wrapped``: through the runner's backend wrappers (the harness schedule, the op log's gemm hook), not logging;
- ``logged``: inside the runner's op log, each call logged, as in every batch the runner runs.

    python bench/probes/harness_tax.py                     # every human kernel at its small shape
    python bench/probes/harness_tax.py gemm_rmsnorm --calls 5000
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from coda_agent.primitives import backend
from coda_agent.primitives._call import GemmCall
from coda_agent.runner.serve import Runner
from coda_agent.tasks.loader import find_task, import_file, load_tasks

REPEATS = 7


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """Median over :data:`REPEATS` runs of ``calls`` calls, in µs per call (a warm-up run first)."""
    for _ in range(max(calls // 10, 10)):
        fn()
    runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def tax(task_name: str, calls: int) -> dict[str, float]:
    task = find_task(task_name)
    assert task.human_file is not None
    human = import_file(task.human_file, f"harness_tax_{task_name}")
    kwargs = {**task.make_inputs(dict(task.shapes["small"][0].dims), seed=0, device="cpu"), **task.constants}
    made: dict[Any, dict[str, torch.Tensor]] = {}

    def nothing(call: GemmCall) -> dict[str, torch.Tensor]:
        key = (call.key, call.store_d)
        if key not in made:
            out, reduced = call.zero_results()
            made[key] = {**out, **reduced}
        return made[key]

    runner = Runner(Path.cwd())
    oplog = runner.oplog

    def logged() -> None:
        with oplog.call():
            human.forward(**kwargs)
        oplog.calls.clear()

    with torch.no_grad():
        with backend.using("fake", run=nothing):
            primitives = per_call_us(lambda: human.forward(**kwargs), calls)
        with backend.using("fake", run=nothing, wrap=runner._observed):
            wrapped = per_call_us(lambda: human.forward(**kwargs), calls)
            with oplog:
                in_log = per_call_us(logged, calls)
    return {"primitives": primitives, "wrapped": wrapped, "logged": in_log}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("tasks", nargs="*", help="task names (default: every task with a human kernel)")
    p.add_argument("--calls", type=int, default=2000, help="calls per timed run")
    args = p.parse_args()
    names = args.tasks or [t.name for t in load_tasks() if t.human_file is not None]
    print(f"{'task':32} {'primitives':>10} {'wrapped':>10} {'logged':>10}  (host µs per forward(), CPU, nothing computed)")
    for name in names:
        r = tax(name, args.calls)
        print(f"{name:32} {r['primitives']:10.1f} {r['wrapped']:10.1f} {r['logged']:10.1f}")


if __name__ == "__main__":
    main()
