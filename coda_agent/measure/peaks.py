"""The device's ceilings, measured (not taken from a datasheet), and the speed-of-light model built on
them."""

from __future__ import annotations

from collections.abc import Callable
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
            compute_us=flops / (peaks.tflops_bf16 * 1e12) * 1e6,
            memory_us=nbytes / (peaks.hbm_tbps * 1e12) * 1e6,
        ))
    return points


#: The matmul shapes (M, N, K) whose best rate is the compute ceiling: the square one, and the narrow-N,
#: long-K projections where cuBLAS runs fastest. On the H200 (bench/results/h200-2026-12-02-d.json) cuBLAS
#: reached 806-815 TFLOP/s at the bench's 8192x2048x16384 and 8192x4096x14336 rows against 782 at 8192^3, so a
#: ceiling taken at 8192^3 alone put the cuBLAS baselines of those rows above 100% of the speed of light.
PEAK_MM_SHAPES: tuple[tuple[int, int, int], ...] = ((8192, 8192, 8192), (8192, 2048, 16384),
                                                    (8192, 4096, 14336))


def measure_peaks(
    clock: Clock | None = None, shapes: tuple[tuple[int, int, int], ...] = PEAK_MM_SHAPES,
    copy_bytes: int = 2 * 1024**3,
) -> Peaks:
    """Peak bf16 matmul rate (the best of cuBLAS at ``shapes`` on random data) and HBM bandwidth (a
    device-to-device copy).

    Taken as the median over interleaved batches, the protocol every kernel is timed with (so a ceiling is
    taken at the kernels' operating point); the copy counts read + write bytes.
    """
    clock = clock or Clock("cuda")

    def mm(m: int, n: int, k: int) -> Callable[[], object]:
        """A (M, K) @ W(N, K)^T, the layout of most tasks' cuBLAS baselines (``baselines.gemm_layouts``)."""
        a = torch.randn(m, k, device=clock.device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=clock.device, dtype=torch.bfloat16) / k**0.5
        out = torch.empty(m, n, device=clock.device, dtype=torch.bfloat16)
        return lambda: torch.mm(a, w.t(), out=out)

    mms = {f"{m}x{n}x{k}": (2 * m * n * k, mm(m, n, k)) for m, n, k in shapes}
    src = torch.empty(copy_bytes // 2, device=clock.device, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    t = time_interleaved(
        {**{name: fn for name, (_, fn) in mms.items()}, "copy": lambda: dst.copy_(src)},
        clock,
        RepPlan(warmup=5, target_s=0.3, min_reps=20, max_reps=60),
    )
    rates = {name: flops / (t[name].median_us * 1e-6) / 1e12 for name, (flops, _) in mms.items()}
    best = max(rates, key=rates.__getitem__)
    tbps = 2 * src.numel() * src.element_size() / (t["copy"].median_us * 1e-6) / 1e12
    others = ", ".join(f"{name} {rate:.0f}" for name, rate in rates.items() if name != best)
    how = (
        f"bf16 cuBLAS mm, the best of {len(rates)} shapes on random data: {best}"
        + (f" (against {others} TFLOP/s)" if others else "")
        + f"; device copy of {copy_bytes / 2**30:.3g} GiB (read + write); medians of interleaved batches, as "
          "kernels are timed"
    )
    return Peaks(tflops_bf16=rates[best], hbm_tbps=tbps, how=how)


def speed_of_light_us(flops: float, min_bytes: float, peaks: Peaks) -> float:
    """max(compute time at the peak matmul rate, memory time at the peak bandwidth), in microseconds."""
    return max(flops / (peaks.tflops_bf16 * 1e12), min_bytes / (peaks.hbm_tbps * 1e12)) * 1e6
