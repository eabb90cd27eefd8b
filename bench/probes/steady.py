"""Each variant run back to back for a few seconds, with the SM clock and power it ran at (``schedule_probe.py
--steady``).

Issue 44's question after the H200 session 2026-12-06-a: is the epilogue's cost paid in cycles or in clock? Under
ncu (clocks locked at base, 1.31 GHz) gemm_rmsnorm_bwd's K-3072 dgrad row on the load-ahead kernel took 3.6% longer
than its plain twin; at the H200's own clocks 14.7% (594.6 against 518.6 µs), and the 1 Hz samples of that call
caught 459-608 W with the software power cap's clock-event reason set. Here each variant runs alone for
``seconds`` (no L2 flush, as a training step runs it) while nvidia-smi samples the GPU every 20 ms; the report
gives its time per call, the median SM clock and power over the run's last 70%, the share of samples under the
power cap, and the call in SM cycles (µs x MHz), the figure a clock does not move.
"""

from __future__ import annotations

import datetime
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

#: The software power cap's bit in nvidia-smi's clocks_event_reasons.active.
SW_POWER_CAP = 0x4
FIELDS = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"


class GpuSampler:
    """nvidia-smi's SM clock (MHz), power (W) and clock-event reasons every ``period_ms``, stamped with the
    GPU machine's own clock."""

    def __init__(self, period_ms: int = 20) -> None:
        self.samples: list[tuple[float, int, float, int]] = []
        self._proc = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", "-lms", str(period_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.samples.append((stamp, int(parts[1]), float(parts[2]), int(parts[3], 16)))
            except (ValueError, IndexError):  # a line cut short, or a field this driver lacks
                continue

    def between(self, start: float, end: float) -> list[tuple[float, int, float, int]]:
        return [s for s in self.samples if start <= s[0] <= end]

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=5)


def steady(variants: Mapping[str, Callable[[], Any]], seconds: float, sync: Callable[[], None],
           sampler: GpuSampler) -> dict[str, dict[str, float]]:
    """Each variant alone, back to back for ``seconds``, in the order given: µs per call, median MHz and W over
    the last 70% of its run, the share of those samples under the power cap, and cycles per call."""
    found: dict[str, dict[str, float]] = {}
    for name, fn in variants.items():
        fn()
        sync()
        calls, start = 0, time.time()
        while time.time() - start < seconds:
            for _ in range(10):
                fn()
            calls += 10
            sync()
        end = time.time()
        us = (end - start) / calls * 1e6
        window = sampler.between(start + 0.3 * (end - start), end)
        if not window:
            found[name] = {"us": us, "calls": calls, "samples": 0}
            continue
        mhz = statistics.median(s[1] for s in window)
        found[name] = {
            "us": us, "calls": calls, "samples": len(window), "mhz": mhz,
            "watts": statistics.median(s[2] for s in window),
            "power_capped": sum(1 for s in window if s[3] & SW_POWER_CAP) / len(window),
            "kcycles": us * mhz / 1e3,
        }
    return found


def report(found: Mapping[str, Mapping[str, float]], base: str | None) -> list[str]:
    """One line per variant, fastest first, with its cycles against ``base``'s."""
    lines = []
    ref = found.get(base, {}).get("kcycles") if base else None
    for name, f in sorted(found.items(), key=lambda kv: kv[1]["us"]):
        if not f.get("samples"):
            lines.append(f"  steady {f['us']:9.1f} us  (no clock samples)  {name}")
            continue
        vs = f"  {f['kcycles'] / ref:.3f}x {base}'s cycles" if ref else ""
        lines.append(f"  steady {f['us']:9.1f} us  {f['mhz']:5.0f} MHz  {f['watts']:5.0f} W  capped "
                     f"{f['power_capped']:4.0%}  {f['kcycles']:8.1f} kcycles{vs}  {name}")
    return lines
