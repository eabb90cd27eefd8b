"""The GPU's clocks and power-cap state while each task of a bench was timed, from ``gpu_session.sh``'s logs.

``bench/gpu_session.sh`` samples ``nvidia-smi`` once a second into ``<phase>-gpu.csv`` and logs the bench's progress
into ``<phase>.log``: a ``== bench: up to ...`` line and the machine's time when each call of the phase began, then
``[  t s] timed TASK ...`` when a task's timing ended. A task's window runs from the previous "timed" line of the
same call (or, for the first, from the last "checked" line) to its own, so it holds the task's set-up and warm-up
too; the bench's clock starts a few seconds after the call's "machine at" line (its imports), so every window sits
that much early. This prints per task the samples in its window,
those drawing more than ``--busy-watts``, the SM clock's least and median over the busy ones, the most power drawn
and how many samples carried the SW-power-cap clock-event reason (0x4). Used for the twelfth session's table
(``bench/results/h200-2026-12-02-f-notes.md``):

    python bench/probes/clock_windows.py bench/results/h200-2026-12-02-f-bench.log bench/results/h200-2026-12-02-f-bench-gpu.csv
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
from datetime import datetime, timedelta
from pathlib import Path

SW_POWER_CAP = 0x4
CALL_START = re.compile(r"machine at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")
CHECKED = re.compile(r"\[\s*([\d.]+) s\] checked ")
TIMED = re.compile(r"\[\s*([\d.]+) s\] timed (\S+)")


def samples(path: Path) -> list[tuple[datetime, int, float, int]]:
    """(time, SM MHz, watts, clock-event reasons) per sample; rows the sampler cut short are skipped."""
    out = []
    with path.open() as f:
        for row in csv.reader(f):
            if len(row) < 6 or row[0].startswith("timestamp"):
                continue
            try:
                out.append((datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f"), int(row[1]), float(row[3]),
                            int(row[5].strip(), 16)))
            except ValueError:
                continue
    return out


def windows(log: Path) -> list[tuple[str, datetime, datetime]]:
    """(task, start, end) of each task's timing, in the log's order."""
    found: list[tuple[str, datetime, datetime]] = []
    start: datetime | None = None
    previous: datetime | None = None
    for line in log.read_text().splitlines():
        if line.startswith("== bench: up to"):
            start, previous = None, None
            continue
        if start is None and (m := CALL_START.search(line)):
            start = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%SZ")
        elif start is not None and (m := CHECKED.match(line)):
            previous = start + timedelta(seconds=float(m.group(1)))
        elif start is not None and (m := TIMED.match(line)):
            end = start + timedelta(seconds=float(m.group(1)))
            found.append((m.group(2), previous or start, end))
            previous = end
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", type=Path, help="the bench phase's log (gpu_session.sh's <phase>.log)")
    p.add_argument("csv", type=Path, help="its GPU samples (<phase>-gpu.csv)")
    p.add_argument("--busy-watts", type=float, default=200.0, help="a sample drawing more is a busy one")
    args = p.parse_args()
    rows = samples(args.csv)
    print(f"{'task':32} {'samples':>7} {'busy':>5} {'SM MHz min':>10} {'median':>7} {'max W':>6} {'capped':>6}")
    for task, start, end in windows(args.log):
        inside = [s for s in rows if start <= s[0] <= end]
        busy = [s for s in inside if s[2] > args.busy_watts]
        clocks = [s[1] for s in busy]
        print(f"{task:32} {len(inside):7} {len(busy):5} {min(clocks, default=0):10} "
              f"{int(statistics.median(clocks)) if clocks else 0:7} {max((s[2] for s in inside), default=0.0):6.0f} "
              f"{sum(1 for s in inside if s[3] & SW_POWER_CAP):6}")


if __name__ == "__main__":
    main()
