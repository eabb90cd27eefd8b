"""Whether a process on this host is still the one a record names: its pid is alive, and (where ``/proc``
says) it started when the record says, so that a pid the kernel handed to a new process since is not taken for
the old one."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """A process with this pid exists on this host (someone else's counts)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):  # gone, or a number no process can have
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def start_time(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (``/proc/<pid>/stat``); None where there is no
    ``/proc`` (macOS) or no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name in parentheses may hold spaces
    except (OSError, IndexError, ValueError):
        return None


def still_running(pid: int, started: int | None) -> bool:
    """The process ``pid`` that started at ``started`` (:func:`start_time`, None: unknown) is still
    running."""
    if pid <= 0 or not alive(pid):
        return False
    now = start_time(pid)
    return started is None or now is None or now == started
