"""The device's ceilings, measured (not taken from a datasheet), and the speed-of-light model built on them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .timing import Clock, RepPlan, time_interleaved


@dataclass(frozen=True)
class Peaks:
    """The device's ceilings, measured (not taken from a datasheet)."""

    tflops_bf16: float
    hbm_tbps: float
    how: str


def measure_peaks(clock: Clock | None = None, n: int = 8192, copy_bytes: int = 2 * 1024**3) -> Peaks:
    """Peak bf16 matmul rate (cuBLAS, n x n x n on random data) and HBM bandwidth (a device-to-device copy).

    Taken as the median over interleaved repetitions; the copy counts read + write bytes.
    """
    clock = clock or Clock("cuda")
    a = torch.randn(n, n, device=clock.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=clock.device, dtype=torch.bfloat16)
    out = torch.empty(n, n, device=clock.device, dtype=torch.bfloat16)
    src = torch.empty(copy_bytes // 2, device=clock.device, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    t = time_interleaved(
        {"mm": lambda: torch.mm(a, b, out=out), "copy": lambda: dst.copy_(src)},
        clock,
        RepPlan(warmup=5, target_s=0.3, min_reps=20, max_reps=60),
    )
    tflops = 2 * n**3 / (t["mm"].median_us * 1e-6) / 1e12
    tbps = 2 * src.numel() * src.element_size() / (t["copy"].median_us * 1e-6) / 1e12
    how = (
        f"bf16 cuBLAS mm {n}x{n}x{n} on random data; device copy of {copy_bytes / 2**30:.0f} GiB "
        "(read + write); medians of interleaved reps"
    )
    return Peaks(tflops_bf16=tflops, hbm_tbps=tbps, how=how)


def speed_of_light_us(flops: float, min_bytes: float, peaks: Peaks) -> float:
    """max(compute time at the peak matmul rate, memory time at the peak bandwidth), in microseconds."""
    return max(flops / (peaks.tflops_bf16 * 1e12), min_bytes / (peaks.hbm_tbps * 1e12)) * 1e6
