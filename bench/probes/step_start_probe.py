"""The host's path from a training step's start to its first GEMM launch, where the GPU waits (issue 45).

In the profiled 2-layer step of the Llama-3 1B stack on an H100 at 6839700 (results/h100-2026-12-07-f-e2e.md)
the GPU waited 791 µs between the first norm's pass (``rms_begin_rows``) and the first task kernel; compile's
longest wait was 73 µs. Every later launch finds the GPU busy. bench-e2e's timed steps run back to back
behind a 1 ms lead-in and never wait so, but a trainer that reads its loss every step (``loss.item()``)
starts each step from an idle GPU and pays this path every step.

Each step here runs as bench-e2e runs it (gradients cleared, the loss forward, backward); the backend's run
function is wrapped so that the step's first GEMM call notes when it starts and when its launch returns. Then
the same prefix (the step's start to that first call's return) under cProfile, which that return switches off
(the step runs on unprofiled), says where its time goes; an exception to cut it there would be charged to the
task op's dispatcher call as it unwinds through C++ (3 ms a step on the CPU). On the CPU (the emulator, the
tiny preset) it only checks that the probe runs.

    source .gpu2/env.sh && cd bench/probes && python3 step_start_probe.py --json $OUT/step-start.json
    .venv/bin/python bench/probes/step_start_probe.py --preset tiny --device cpu --steps 5
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from coda_agent.bench.e2e import PRESETS, build_stack, training_step
from coda_agent.primitives import _emulator, _quack, backend
from coda_agent.torch import Kernels


@contextmanager
def first_gemm_noted(marks: dict[str, float], on_return: Callable[[], Any] | None = None) -> Iterator[None]:
    """The first GEMM call inside notes ``gemm enter`` and ``gemm return`` (perf_counter) in ``marks``, and
    calls ``on_return`` once it returns."""
    runs = {mod: mod.run for mod in (_quack, _emulator)}

    def wrapped(run: Callable[..., Any]) -> Callable[..., Any]:
        def noted(call: Any) -> Any:
            first = "gemm enter" not in marks
            if first:
                marks["gemm enter"] = time.perf_counter()
            out = run(call)
            if first:
                marks["gemm return"] = time.perf_counter()
                if on_return is not None:
                    on_return()
            return out

        return noted

    active = backend.active().name
    for mod, run in runs.items():
        setattr(mod, "run", wrapped(run))  # noqa: B010  (a switch of backend, a task op's, looks it up)
    backend.set_backend(active, wrap=wrapped)  # the backend active now (the CPU's emulator)
    try:
        yield
    finally:
        for mod, run in runs.items():
            setattr(mod, "run", run)  # noqa: B010
        backend.set_backend(active)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="1b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    config = PRESETS[a.preset].model_copy(update={"layers": a.layers})
    dev = a.device
    stack = build_stack(config, dev)
    stack.use(Kernels())
    g = torch.Generator().manual_seed(1)
    h = torch.randn(config.batch, config.seq, config.dim, generator=g).to(device=dev, dtype=torch.bfloat16)
    targets = torch.randint(0, config.vocab, (config.batch, config.seq), generator=g).to(dev)
    step = training_step(stack, stack, h, targets)

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):  # plans, allocator growth
        step()
    sync()
    enter, launched, whole = [], [], []
    for _ in range(a.steps):
        marks: dict[str, float] = {}
        sync()
        with first_gemm_noted(marks):
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
        sync()
        enter.append((marks["gemm enter"] - t0) * 1e6)
        launched.append((marks["gemm return"] - t0) * 1e6)
        whole.append((t1 - t0) * 1e6)
    profiler = cProfile.Profile()
    for _ in range(a.steps):
        marks = {}
        sync()
        stack.zero_grad(set_to_none=True)
        x = h.detach().requires_grad_()
        profiler.enable()
        with first_gemm_noted(marks, on_return=profiler.disable):
            stack(x, targets)
        profiler.disable()  # a step without a GEMM call
    sync()
    listing = io.StringIO()
    pstats.Stats(profiler, stream=listing).sort_stats("cumulative").print_stats(40)
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    result = {
        "device": name, "torch": torch.__version__, "config": config.model_dump(), "steps": a.steps,
        "host_us_to_first_gemm_call": statistics.median(enter),
        "host_us_to_first_gemm_return": statistics.median(launched),
        "host_us_whole_step_issue": statistics.median(whole),
        "profile": listing.getvalue(),
    }
    print(f"{name}, torch {torch.__version__}; preset {a.preset}, {a.layers} layers; medians of {a.steps} "
          "steps")
    for key in ("host_us_to_first_gemm_call", "host_us_to_first_gemm_return", "host_us_whole_step_issue"):
        print(f"  {key:32s} {result[key]:10.1f}")
    print(listing.getvalue())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
