"""SDPA inside CODA's training step against the very same calls replayed alone, each kernel with the SM clock
it ran at (issue 45).

In the 16-layer step on an H100 (results/h100-2026-12-07-c-e2e-16.md) SDPA's kernels took 171.4 ms inside
CODA's step, 164.1 inside compile's and 161.9 alone (random Q/K/V in the layers' layout). Layouts were ruled
out (h100-2026-12-06-a-notes.md), and so was the kind of kernel before SDPA (sdpa_context_probe.py). This
probe separates what SDPA is given from where it runs:

- **in the step**: one profiled CODA step (and compile's, unless ``--no-compile``), every SDPA kernel's time;
- **replayed**: each layer's SDPA call again, alone, on the tensors CODA's step gave it (Q/K/V and the
  output's gradient captured in the step, cloned storage and all, so the strides and the values are the
  step's);
- **random**: the bench's own attention-alone call (``bench.e2e.attention_step``): random values, that
  layout.

Each kernel's SM clock is NVML's, sampled every millisecond on a thread and matched to the kernel by the
profiler's timestamps, so each time also reads as cycles. If replayed calls run as fast as random ones and
the step's take as many cycles at a lower clock, the step's excess is the clock's (the power cap), not
SDPA's inputs.

Measured on an H100 at 16 layers (results/h100-2026-12-07-e-notes.md): each layer's own call replayed alone ran
as the random one (8.82 ms a call, boost clock); inside the steps the same cycles took 170.7 ms a step in CODA's
(about 1690 MHz forward, 1580 backward) and 163.6 in compile's (1790, 1650): the clock, not the inputs.

    source .gpu2/env.sh && cd bench/probes && python3 sdpa_in_step_probe.py --layers 16 --json $OUT/sdpa.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from sdpa_context_probe import ClockSampler

from coda_agent.bench.e2e import PRESETS, attention_step, build_stack, kernel_kind, training_step
from coda_agent.torch import Kernels, ReferenceLlamaStack

ATTENTION = "attention (SDPA)"
MARK = "sdpa-in-step-probe: clock mark"


def clone_keeping_layout(t: torch.Tensor, storages: dict[int, torch.UntypedStorage]) -> torch.Tensor:
    """``t`` on a copy of its whole storage, at its offset and strides: views of one buffer (Q/K/V of one QKV
    tensor) stay views of one copied buffer."""
    src = t.untyped_storage()
    copy = storages.setdefault(src.data_ptr(), src.clone())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(copy, t.storage_offset(), t.size(), t.stride())


@contextmanager
def capturing_sdpa(calls: list[dict[str, Any]]) -> Iterator[None]:
    """Every SDPA call made inside: its Q/K/V, keyword arguments and, once backward has run, its output's
    gradient, each copied as it was then."""
    sdpa = F.scaled_dot_product_attention
    storages: dict[int, torch.UntypedStorage] = {}

    def capture(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        out = sdpa(q, k, v, **kw)
        call = {"qkv": [clone_keeping_layout(t.detach(), storages) for t in (q, k, v)], "kw": kw}
        calls.append(call)
        if out.requires_grad:
            out.register_hook(lambda g: call.__setitem__("dout", clone_keeping_layout(g.detach(), {})))
        return out

    F.scaled_dot_product_attention = capture
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa


def replay(call: dict[str, Any]) -> Callable[[], None]:
    """One captured SDPA call, forward and backward, alone."""
    q, k, v = (t.detach().requires_grad_() for t in call["qkv"])

    def run() -> None:
        out = F.scaled_dot_product_attention(q, k, v, **call["kw"])
        torch.autograd.grad(out, (q, k, v), call["dout"])

    return run


def attention_kernels(fn: Callable[[], object], clocks: ClockSampler) -> list[dict[str, Any]]:
    """SDPA's kernels while ``fn`` runs, in the order they started: name, µs, the mean SM clock over it."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        mark = time.perf_counter()
        with record_function(MARK):
            pass
        fn()
        torch.cuda.synchronize()
    events = list(prof.events())
    (marked,) = [e for e in events if e.name == MARK]
    offset_us = marked.time_range.start - mark * 1e6  # profiler µs = host perf_counter µs + offset
    rows = []
    for e in sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                     and kernel_kind(e.name) == ATTENTION), key=lambda e: e.time_range.start):
        start, end = ((t - offset_us) / 1e6 for t in (e.time_range.start, e.time_range.end))
        mhz, watts = clocks.between(start, end)
        rows.append({"name": e.name, "us": e.time_range.end - e.time_range.start, "mhz": mhz, "watts": watts})
    return rows


def is_forward(name: str) -> bool:
    return "fprop" in name or "fwd" in name


def is_main(name: str) -> bool:
    """The attention kernel itself (cuDNN's fprop/bprop, flash's fwd/bwd), not its helpers."""
    return any(word in name for word in ("fprop", "bprop", "fwd", "bwd"))


def summary(kernels: list[dict[str, Any]], forward: bool) -> dict[str, float]:
    """One direction's calls: per call µs (the main kernel and its helpers), the main kernel's median µs and
    clock, and the clock-weighted cycles a call."""
    got = [k for k in kernels if is_forward(k["name"]) == forward]
    mains = [k for k in got if is_main(k["name"])]
    if not mains:
        return {}
    return {"calls": len(mains), "us_per_call": sum(k["us"] for k in got) / len(mains),
            "main_median_us": statistics.median(k["us"] for k in mains),
            "main_mhz": statistics.median(k["mhz"] for k in mains),
            "mcycles_per_call": sum(k["us"] * k["mhz"] for k in got) / 1e6 / len(mains)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="1b", choices=PRESETS)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps of each model")
    ap.add_argument("--reps", type=int, default=5, help="replays of each captured call, and random calls")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    config = PRESETS[a.preset].model_copy(update={"layers": a.layers})
    dev = "cuda"
    coda = build_stack(config, dev)
    kernels = Kernels()
    coda.use(kernels)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(config.batch, config.seq, config.dim, generator=g).to(device=dev, dtype=torch.bfloat16)
    targets = torch.randint(0, config.vocab, (config.batch, config.seq), generator=g).to(dev)
    steps = {"coda step": training_step(coda, coda, h, targets)}
    if not a.no_compile:
        reference = ReferenceLlamaStack.like(coda)
        steps["compile step"] = training_step(reference, torch.compile(reference, fullgraph=True), h, targets)
    for step in steps.values():  # compiles, plans, allocator growth
        step()
        step()
    captured: list[dict[str, Any]] = []
    with capturing_sdpa(captured):
        steps["coda step"]()
    torch.cuda.synchronize()
    assert len(captured) == a.layers and all("dout" in c for c in captured), "one SDPA call a layer"
    runs: dict[str, list[dict[str, Any]]] = {}
    clocks = ClockSampler()
    for _ in range(a.steps):  # interleaved, so the machine's drift falls on both alike
        for name, step in steps.items():
            runs.setdefault(name, []).extend(attention_kernels(step, clocks))
    random_call = attention_step(config, dev)
    random_call()
    replays = [replay(c) for c in captured]
    for r in replays:
        r()
    for _ in range(a.reps):
        for i, r in enumerate(replays):
            runs.setdefault(f"layer {i} replayed", []).extend(attention_kernels(r, clocks))
            runs.setdefault("random", []).extend(attention_kernels(random_call, clocks))
    clocks.stop()
    cudnn = torch.backends.cudnn.version()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {cudnn}; "
          f"preset {a.preset}, {a.layers} layers, {config.batch} x {config.seq} tokens; {a.steps} profiled "
          f"steps, {a.reps} replays of each layer's call")
    print(f"{'where':22s} {'phase':5s} {'calls':>5s} {'us/call':>9s} {'main us':>9s} {'main MHz':>8s} "
          f"{'Mcycles/call':>12s}")
    table = {}
    for name, got in runs.items():
        for phase, forward in (("fwd", True), ("bwd", False)):
            s = summary(got, forward)
            if s:
                table[f"{name} {phase}"] = s
                print(f"{name:22s} {phase:5s} {s['calls']:5.0f} {s['us_per_call']:9.1f} "
                      f"{s['main_median_us']:9.1f} {s['main_mhz']:8.0f} {s['mcycles_per_call']:12.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "config": config.model_dump(),
                       "summary": table, "kernels": runs}, f, indent=1)


if __name__ == "__main__":
    main()
