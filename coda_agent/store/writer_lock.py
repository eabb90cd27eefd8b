"""One writer at a time for a run directory (or a sweep): a lock file that says who holds it, and whether they
live.

The lock is a small JSON file (``{pid, host, started, pid_start}``) that the writer keeps open under ``flock``
for as long as it writes, and whose modification time is its heartbeat (touched every :data:`HEARTBEAT_S`
seconds).

Why this design:

* ``flock`` is what makes it correct on one host: the kernel releases it when the holder dies, however (``kill
  -9`` included), so a lock whose flock can be taken has no live writer, and no pid has to be trusted for
  that.
* The JSON names the holder, for the refusal's one line, and lets a reader judge liveness without taking the
  lock (the viewer, ``show``, the index): on this host, is that pid alive and did it start when the lock says
  (a reused pid is not the writer); on another host (a shared runs folder), is the heartbeat younger than
  :data:`STALE_S`. Another host's writer is refused on a fresh heartbeat too, in case the file system's flock
  does not reach it.
* The content is written once, whole, before the file takes the lock's name (``link`` to create it, ``rename``
  to take over a dead holder's), so nobody ever reads half of it; the heartbeat is the mtime, so it is never
  rewritten. A takeover renames over the dead lock while holding its flock, and a taker checks that the name
  still leads to the file it locked, so two takers cannot both win.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType

from ..processes import start_time, still_running
from ..provenance import host_name

#: Seconds between heartbeats.
HEARTBEAT_S = 10.0
#: A holder on another host whose heartbeat is older than this is taken for dead (a few missed beats, and the
#: attribute caching of a network file system).
STALE_S = 90.0


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a lock, and its last heartbeat (seconds since the epoch)."""

    pid: int
    host: str
    started: str
    pid_start: int | None
    heartbeat: float

    def alive(self) -> bool:
        """Still writing, as far as a reader can tell without the lock: this host's process still runs, or
        another host's heartbeat is fresh."""
        if self.host == host_name():
            return still_running(self.pid, self.pid_start)
        return time.time() - self.heartbeat < STALE_S

    def describe(self) -> str:
        """``pid 1234 on host gpu-7 (heartbeat 3 s ago)``."""
        return f"pid {self.pid} on host {self.host} (heartbeat {_ago(time.time() - self.heartbeat)} ago)"


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def _holder_of(fd: int) -> Holder | None:
    """The holder an open lock file names; None when it names none (unreadable, not ours)."""
    try:
        mtime = os.fstat(fd).st_mtime
        data = json.loads(os.pread(fd, 4096, 0))
        return Holder(int(data["pid"]), str(data["host"]), str(data["started"]), data.get("pid_start"), mtime)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_holder(path: Path) -> Holder | None:
    """Who the lock at ``path`` names, live or dead; None when there is no lock (or it names no one). Takes no
    lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _holder_of(fd)
    finally:
        os.close(fd)


def live_holder(path: Path) -> Holder | None:
    """The live writer holding the lock at ``path``, or None when no one is writing."""
    holder = read_holder(path)
    return holder if holder is not None and holder.alive() else None


class WriterBusy(Exception):
    """Someone else is writing; the message is one line naming them and what to do."""


def _try_flock(fd: int) -> bool | None:
    """Take the flock: True, False (held by a live process), None (the file system has no flock)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class WriterLock:
    """A held lock: released by :meth:`release` (or the process's end, however it ends)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name=f"heartbeat {path.parent.name}",
                                      daemon=True)
        self._beat.start()

    @classmethod
    def acquire(cls, path: Path, what: str) -> WriterLock:
        """Hold the lock at ``path``, taking it over from a dead holder; WriterBusy names a live one (``what``
        is what the lock guards, as the message names it: ``run 20261204-...``)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
        me = {"pid": os.getpid(), "host": host_name(), "started": datetime.now(timezone.utc).isoformat(),
              "pid_start": start_time(os.getpid())}
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, json.dumps(me).encode())
            os.fsync(fd)
            _try_flock(fd)  # nobody else knows this file yet: it is ours whatever the answer
            while True:
                try:
                    os.link(tmp, path)  # fails when a lock exists; else the lock exists, whole, and is ours
                    break
                except FileExistsError:
                    if cls._take_over(tmp, path, what):
                        break
            return cls(path, fd)
        except BaseException:
            os.close(fd)
            raise
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    @staticmethod
    def _take_over(tmp: Path, path: Path, what: str) -> bool:
        """Rename ``tmp`` over the existing lock if its holder is dead; False when the lock changed meanwhile
        (try again); WriterBusy when its holder lives."""
        try:
            old = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # released meanwhile
            return False
        try:
            flocked = _try_flock(old)
            holder = _holder_of(old)
            if flocked is False:
                who = holder.describe() if holder else f"another process (it holds {path})"
                raise WriterBusy(f"{what} is being written by {who}; wait for it to end or stop it first")
            if not _same_file(old, path):  # another taker won: look again
                return False
            # A flock taken on this host means its holder here is gone; another host's needs a stale
            # heartbeat.
            if holder is not None and holder.alive() and (flocked is None or holder.host != host_name()):
                raise WriterBusy(f"{what} is being written by {holder.describe()}; wait for it to end or "
                                 "stop it first")
            os.rename(tmp, path)
            return True
        finally:
            os.close(old)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                now = time.time()
                os.utime(self._fd, (now, now))

    def release(self) -> None:
        """Stop the heartbeat and remove the lock (unless another host took it over meanwhile), then let it
        go."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._beat.join(timeout=1)
        if _same_file(self._fd, self.path):
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self._fd)

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
