"""``measure.energy``: joules a step from a counter, on the CPU with a counter that counts the steps; without
a GPU there is no NVML counter."""

from __future__ import annotations

import pytest

from coda_agent.measure.energy import EnergyCounter, energy_counter, energy_per_step


class FakeNvml:
    """NVML's counter as a step drives it: 2.5 J (2500 mJ) a step."""

    def __init__(self) -> None:
        self.millijoules = 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        return self.millijoules


def test_joules_a_step_are_the_counters_rise_over_a_run_of_steps():
    nvml = FakeNvml()
    syncs: list[int] = []

    def step() -> None:
        nvml.millijoules += 2500

    e = energy_per_step(step, EnergyCounter(nvml, None), lambda: syncs.append(nvml.millijoules), min_s=0.0)
    assert e.joules == pytest.approx(2.5) and e.steps == 2  # at least two steps, the sizing step not counted
    assert e.watts > 0 and len(syncs) == 3


def test_there_is_no_counter_without_a_gpu():
    assert energy_counter(0) is None
