"""The device's ceilings, measured (not taken from a datasheet), and the speed-of-light model built on them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..tasks.model import Task
from .timing import Clock, RepPlan, time_interleaved


@dataclass(frozen=True)
class Peaks:
    """The device's ceilings, measured (not taken from a datasheet)."""

    tflops_bf16: float
    hbm_tbps: float
    how: str
    measured: bool = True

    def label(self) -> str:
        """Which ceiling a speed-of-light figure refers to, in one line."""
        kind = "measured on this GPU" if self.measured else "nominal, not measured"
        return f"{kind}: {self.tflops_bf16:.0f} TFLOP/s bf16, {self.hbm_tbps:.2f} TB/s HBM ({self.how})"


#: The H200 SXM datasheet's ceilings, for where nothing was measured (a CPU-only run's prompts).
NOMINAL_H200 = Peaks(tflops_bf16=989.0, hbm_tbps=4.8, how="H200 SXM datasheet, bf16 dense", measured=False)


@dataclass(frozen=True)
class SolPoint:
    """Speed of light of one shape point: the compute and memory roofs under some peaks."""

    shape: str
    dims: str
    flops: float
    bytes: float
    compute_us: float
    memory_us: float

    @property
    def sol_us(self) -> float:
        return max(self.compute_us, self.memory_us)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_us >= self.memory_us else "memory"


def speed_of_light(task: Task, set_name: str, peaks: Peaks) -> list[SolPoint]:
    """SoL time = max(FLOPs / peak, minimal bytes / bandwidth) at each shape of ``set_name``."""
    points = []
    for p in task.shape(set_name):
        flops, nbytes = task.flops(p.dims), task.min_bytes(p.dims)
        points.append(SolPoint(
            shape=p.name, dims=", ".join(f"{k}={v}" for k, v in p.dims.items()), flops=flops, bytes=nbytes,
            compute_us=flops / (peaks.tflops_bf16 * 1e12) * 1e6, memory_us=nbytes / (peaks.hbm_tbps * 1e12) * 1e6,
        ))
    return points


def measure_peaks(clock: Clock | None = None, n: int = 8192, copy_bytes: int = 2 * 1024**3) -> Peaks:
    """Peak bf16 matmul rate (cuBLAS, n x n x n on random data) and HBM bandwidth (a device-to-device copy).

    Taken as the median over interleaved batches, the protocol every kernel is timed with (so a ceiling is taken
    at the kernels' operating point); the copy counts read + write bytes.
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
        "(read + write); medians of interleaved batches, as kernels are timed"
    )
    return Peaks(tflops_bf16=tflops, hbm_tbps=tbps, how=how)


def speed_of_light_us(flops: float, min_bytes: float, peaks: Peaks) -> float:
    """max(compute time at the peak matmul rate, memory time at the peak bandwidth), in microseconds."""
    return max(flops / (peaks.tflops_bf16 * 1e12), min_bytes / (peaks.hbm_tbps * 1e12)) * 1e6
