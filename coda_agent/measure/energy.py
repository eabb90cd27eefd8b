"""The GPU's energy counter (NVML's total energy, through NVIDIA's nvidia-ml-py): the joules a run of work
spends.

Under the board's power cap a sustained workload is paced by its energy as well as by its kernels: in the
end-to-end bench's timed loop an H100 sat at its 700 W cap with the SM clock at 1425-1560 MHz, and a step ran
up to 6% slower than the same step alone (bench/results/h100-2026-12-06-f-notes.md). Joules a step say how
much of a variant's time the cap will take back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

#: The shortest run :func:`energy_per_step` measures: long enough to reach the cap and for the counter's
#: updates (milliseconds apart) to vanish in the total.
MIN_RUN_S = 3.0


class StepEnergy(BaseModel):
    """Joules a step, and the mean power of the run of steps that measured it."""

    joules: float = Field(description="the GPU's energy a step, by NVML's counter")
    watts: float = Field(description="the run's mean power: what the cap compares")
    steps: int = Field(description="the steps run back to back")


class EnergyCounter:
    """NVML's total energy counter of one GPU (millijoules since the driver loaded)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle

    def joules(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) / 1e3


def energy_counter(cuda_index: int) -> EnergyCounter | None:
    """The counter of the GPU torch calls ``cuda_index``; None without nvidia-ml-py, or on a GPU without the
    counter (before Volta)."""
    try:
        import pynvml
    except ImportError:
        return None
    import torch

    try:
        pynvml.nvmlInit()
        # CUDA_VISIBLE_DEVICES renumbers the GPUs torch sees; NVML numbers them all
        nvml_index = torch.cuda._get_nvml_device_index(cuda_index)
        counter = EnergyCounter(pynvml, pynvml.nvmlDeviceGetHandleByIndex(nvml_index))
        counter.joules()
    except (pynvml.NVMLError, RuntimeError, ValueError):
        return None
    return counter


def energy_per_step(step: Callable[[], object], counter: EnergyCounter, sync: Callable[[], None],
                    min_s: float = MIN_RUN_S) -> StepEnergy:
    """``step`` run back to back for at least ``min_s`` (sized by one timed step), the joules between the two
    synchronisations around the run divided by its steps."""
    sync()
    started = time.perf_counter()
    step()
    sync()
    steps = max(2, round(min_s / max(time.perf_counter() - started, 1e-6)))
    before, started = counter.joules(), time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    seconds, joules = time.perf_counter() - started, counter.joules() - before
    return StepEnergy(joules=joules / steps, watts=joules / seconds, steps=steps)
