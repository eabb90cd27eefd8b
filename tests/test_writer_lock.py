"""The writer lock: one holder at a time, a dead holder's lock taken over, liveness judged without taking the
lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from coda_agent.processes import start_time
from coda_agent.provenance import host_name
from coda_agent.store.writer_lock import STALE_S, WriterBusy, WriterLock, live_holder, read_holder


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def plant(path, *, pid: int, host: str | None = None, pid_start: int | None = None, age: float = 0.0) -> None:
    """A lock file as another process would have left it (no flock held: that process is gone or
    elsewhere)."""
    path.write_text(json.dumps({"pid": pid, "host": host or host_name(),
                                "started": "2026-01-01T00:00:00+00:00", "pid_start": pid_start}))
    then = time.time() - age
    os.utime(path, (then, then))


def test_one_holder_at_a_time_named_in_one_line(tmp_path):
    path = tmp_path / "writer.lock"
    with WriterLock.acquire(path, "run r1") as lock:
        holder = live_holder(path)
        assert holder is not None and holder.pid == os.getpid() and holder.host == host_name()
        with pytest.raises(WriterBusy) as busy:
            WriterLock.acquire(path, "run r1")
        message = str(busy.value)
        assert "\n" not in message
        assert message.startswith(
            f"run r1 is being written by pid {os.getpid()} on host {host_name()} (heartbeat ")
        assert message.endswith("; wait for it to end or stop it first")
        assert lock.path == path
    assert not path.exists() and live_holder(path) is None, "the lock goes when its writer ends"
    assert not [p.name for p in tmp_path.iterdir()], "no temporary file left"


def test_a_dead_holders_lock_is_taken_over(tmp_path):
    path = tmp_path / "writer.lock"
    plant(path, pid=dead_pid())
    assert read_holder(path) is not None and live_holder(path) is None
    with WriterLock.acquire(path, "run r1"):
        assert live_holder(path).pid == os.getpid()


def test_a_reused_pid_is_not_the_writer(tmp_path):
    path = tmp_path / "writer.lock"
    mine = start_time(os.getpid())
    if mine is None:
        pytest.skip("no /proc here: a pid's start time is unknown")
    plant(path, pid=os.getpid(), pid_start=mine + 1)  # this pid, but a process that started at another time
    assert live_holder(path) is None
    plant(path, pid=os.getpid(), pid_start=mine)
    assert live_holder(path) is not None


def test_another_hosts_writer_lives_while_its_heartbeat_is_fresh(tmp_path):
    path = tmp_path / "writer.lock"
    plant(path, pid=1, host="elsewhere", age=5)
    with pytest.raises(WriterBusy, match=r"pid 1 on host elsewhere \(heartbeat 5 s ago\)"):
        WriterLock.acquire(path, "run r1")
    plant(path, pid=1, host="elsewhere", age=STALE_S + 1)
    assert live_holder(path) is None
    with WriterLock.acquire(path, "run r1"):
        assert read_holder(path).host == host_name()
