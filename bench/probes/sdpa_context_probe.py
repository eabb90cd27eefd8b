"""Causal GQA attention (torch's SDPA, forward + backward) at the 1B stack's batch, timed after what runs
before it in a training step (issue 45).

In the 16-layer step on an H100 (results/h100-2026-12-07-c-e2e-16.md) SDPA took 171.4 ms inside CODA's step,
164.1 inside compile's and 161.9 alone; its inputs' layouts were ruled out (h100-2026-12-06-a-notes.md). This
times the same call after an idle GPU, right after a long run of GEMMs (as CODA's layer hands SDPA the output
of its QKV GEMM, and its backward follows the o-projection's GEMMs), and right after memory-bound passes of
the same length (as compile's Triton kernels precede it), with the SM clock and the power (NVML, every
millisecond) over each call. If the calls after GEMMs are slower at a lower clock, the excess is the power
cap's, not SDPA's inputs.

    source .gpu2/env.sh && python3 bench/probes/sdpa_context_probe.py --json $OUT/sdpa-context.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from coda_agent.bench.e2e import PRESETS


class ClockSampler:
    """The SM clock and the board's power, read through NVML every millisecond on a thread of its own, each
    sample stamped with the host's ``time.perf_counter``."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda._get_nvml_device_index(0))
        self.samples: list[tuple[float, float, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nvml, handle = self._nvml, self._handle
        while not self._done.is_set():
            mhz = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
            watts = nvml.nvmlDeviceGetPowerUsage(handle) / 1e3
            self.samples.append((time.perf_counter(), float(mhz), watts))
            time.sleep(0.001)

    def between(self, begin: float, end: float) -> tuple[float, float]:
        """The mean clock and power of the samples taken from ``begin`` to ``end`` (NaN where none was)."""
        inside = [s for s in self.samples if begin <= s[0] <= end]
        if not inside:
            return float("nan"), float("nan")
        return statistics.fmean(s[1] for s in inside), statistics.fmean(s[2] for s in inside)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="1b", choices=PRESETS, help="the end-to-end bench's model and batch")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--lead-ms", type=float, default=30.0, help="how long each lead-in runs before the call")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    m = PRESETS[a.preset]
    n_q, n_kv, head_dim = m.n_heads, m.n_kv_heads, m.dim // m.n_heads
    tokens = m.batch * m.seq
    dev = "cuda"
    qkv = torch.randn(tokens, (n_q + 2 * n_kv) * head_dim, device=dev, dtype=torch.bfloat16)
    q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in
               qkv.view(m.batch, m.seq, n_q + 2 * n_kv, head_dim).split([n_q, n_kv, n_kv], dim=2))
    dout = torch.randn(m.batch, m.seq, n_q, head_dim, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    # the MLP's down projection at the stack's shape (a GEMM of the step), and a copy of the same bytes
    x = torch.randn(tokens, m.ffn_dim, device=dev, dtype=torch.bfloat16)
    w = torch.randn(m.ffn_dim, m.dim, device=dev, dtype=torch.bfloat16)
    big = torch.empty(256 * 2**20, device=dev, dtype=torch.bfloat16)
    flush = torch.empty(256 * 2**20, device=dev, dtype=torch.uint8)

    def attention() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_q != n_kv).backward(dout)

    def repeat_for(fn: Callable[[], object], ms: float) -> Callable[[], None]:
        """``fn`` as many times as take about ``ms`` on this GPU (sized once)."""
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times = max(1, round(ms / start.elapsed_time(end)))

        def run() -> None:
            for _ in range(times):
                fn()
        return run

    leads: dict[str, Callable[[], None]] = {
        "idle GPU": lambda: torch.cuda._sleep(int(a.lead_ms * 1.7e6)),  # cycles: about lead_ms at 1.7 GHz
        "after GEMMs": repeat_for(lambda: x @ w, a.lead_ms),
        "after memory passes": repeat_for(lambda: big.mul_(1.0), a.lead_ms),
    }
    clocks = ClockSampler()
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in leads}
    attention()
    for _ in range(a.reps):
        for name, lead in leads.items():  # interleaved, so the machine's drift falls on every context alike
            flush.zero_()
            torch.cuda.synchronize()
            origin, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            origin.record()
            t0 = time.perf_counter()  # the GPU is idle, so the origin event completes about now
            lead()
            start.record()
            attention()
            end.record()
            torch.cuda.synchronize()
            began, ended = (t0 + origin.elapsed_time(e) / 1e3 for e in (start, end))
            mhz, watts = clocks.between(began, ended)
            samples[name].append((start.elapsed_time(end), mhz, watts))
            for t in (q, k, v):
                t.grad = None
    clocks.stop()
    rows = []
    name_dev = torch.cuda.get_device_name()
    print(f"{name_dev}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; B {m.batch} "
          f"S {m.seq} heads {[n_q, n_kv]} d {head_dim}; lead-ins of {a.lead_ms:g} ms; {a.reps} calls each")
    for name, got in samples.items():
        ms = [g[0] for g in got]
        row = {"context": name, "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
               "sm_mhz": statistics.median(g[1] for g in got), "watts": statistics.median(g[2] for g in got)}
        rows.append(row)
        print(f"{name:20s} SDPA fwd+bwd {row['median_ms']:7.3f} ms (min {row['min_ms']:.3f}, max "
              f"{row['max_ms']:.3f}); during it: SM {row['sm_mhz']:.0f} MHz, {row['watts']:.0f} W")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
