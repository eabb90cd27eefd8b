"""The tune stage's builds: the configs a search will propose, built for sm_90a by CPU processes side by side
while the GPU times the ones built already.

A proposal the GPU runner has to build first costs its build (2-7 s on the H200) before its few milliseconds
of timing, one proposal after another. Here up to :data:`BUILDERS` runners on the ``quack-compile`` backend
(QuACK's compile-only path, no GPU) take configs off one queue, in the order the search proposes them, and
build each under the harness's schedule at the task's first small shape: a kernel does not depend on the
sizes, and QuACK's compile cache, which the candidate's runners share (:func:`~.caches.quack_cache_for`), is
where the kernels meet, as in QuACK's own autotuner and its compile pool. The search waits for a config's
build (:meth:`Builds.wait`) just before it proposes it, so timing starts with the first kernel built rather
than the last: at the H200, building a shape's 36 configs first took the whole of a 45 s budget, and the
search then timed one (2026-12-05).

A build that fails is not proposed at all: one the primitives refuse, or one that takes its process down. A
compiler abort (``std::bad_variant_access`` from a tile QuACK cannot build) costs one builder, which is
started again, and not the search's runner, whose restarts are few.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Protocol

from ..primitives import Config
from ..primitives.configs import Schedule
from .client import Batch, CandidateRaised, RunnerCrashed, RunnerError, last_line

#: Builders at once: half the CPUs (each build is one busy core and 1-2 GB), at most 8 (QuACK's pool default).
BUILDERS = max(1, min(8, (os.cpu_count() or 2) // 2))
#: (epilogue name, config): what one build makes.
Build = tuple[str, Config]


class BuildClient(Protocol):
    """What a builder needs of a runner (:class:`~.client.RunnerClient`)."""

    def set_schedule(self, table: Schedule) -> None: ...
    def run(self, calls: list[str], keep: list[int], dry: bool = False, trace: bool = True) -> Batch: ...
    def cancel(self) -> None: ...


#: Starts a runner on the compile-only backend with the small shape's inputs put as set ``"build"``.
StartBuilder = Callable[[], AbstractContextManager[BuildClient]]


class Builds:
    """Builds under way in the background until ``deadline`` (monotonic) or :meth:`close`.

    :meth:`add` queues builds (each at most once), :meth:`wait` says when one is ready to propose,
    :meth:`skip` drops what is still queued once a search no longer needs it (a later :meth:`add` may queue it
    again), :meth:`close` ends every builder, a build under way included.
    """

    def __init__(self, start: StartBuilder, deadline: float, workers: int = BUILDERS) -> None:
        self._start, self.deadline, self._workers = start, deadline, workers
        self._cond = threading.Condition()
        self._queue: deque[Build] = deque()
        self._building: dict[Build, BuildClient] = {}
        self._built: set[Build] = set()
        self.failed: dict[Build, str] = {}
        self._alive = 0
        self._closed = False
        #: how many builds were queued, built, failed and skipped (queued, never built)
        self.counts = {"queued": 0, "built": 0, "failed": 0, "skipped": 0}

    def start(self) -> None:
        """Start the builders before there is work, so that their runners' start-up overlaps the search's."""
        with self._cond:
            self._spawn(self._workers)

    def add(self, builds: Iterable[Build]) -> int:
        """Queue the builds not queued, under way or done already; how many were new."""
        with self._cond:
            known = {*self._queue, *self._building, *self._built, *self.failed}
            new = [b for b in dict.fromkeys(builds) if b not in known]
            self._queue.extend(new)
            self.counts["queued"] += len(new)
            self._spawn(min(self._workers, len(self._queue) + len(self._building)))
            self._cond.notify_all()
            return len(new)

    def _spawn(self, wanted: int) -> None:
        """Builders until ``wanted`` are alive (the lock held)."""
        while self._alive < wanted and not self._closed and time.monotonic() < self.deadline:
            self._alive += 1
            threading.Thread(target=self._builder, daemon=True).start()

    def wait(self, build: Build, until: float) -> str | None:
        """Block until ``build`` is built or failed, or no builder is left to build it, or ``until``
        (monotonic); why its build failed, else None (propose it: what is not built yet, the GPU runner
        builds)."""
        with self._cond:
            while (build in self._queue or build in self._building) and self._alive:
                left = until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self.failed.get(build)

    def skip(self) -> None:
        """Drop the builds still queued (the builds under way finish)."""
        with self._cond:
            self.counts["skipped"] += len(self._queue)
            self._queue.clear()

    def close(self) -> None:
        """End every builder now: the queue dropped, the builds under way cancelled (their runners killed;
        QuACK writes a kernel to its cache by an atomic rename, so none is left half written)."""
        with self._cond:
            self._closed = True
            self.skip()
            under_way = list(self._building.values())
            self._cond.notify_all()
        for client in under_way:
            client.cancel()

    def _next(self, client: BuildClient) -> Build | None:
        """The next build for ``client`` to make, once there is one; None once closed or past the deadline."""
        with self._cond:
            while not self._queue and not self._closed and time.monotonic() < self.deadline:
                self._cond.wait(min(1.0, max(0.0, self.deadline - time.monotonic())))
            if self._closed or time.monotonic() >= self.deadline or not self._queue:
                return None
            build = self._queue.popleft()
            self._building[build] = client
            return build

    def _done(self, build: Build, failure: str | None) -> None:
        with self._cond:
            self._building.pop(build, None)
            if failure is None:
                self._built.add(build)
            else:
                self.failed[build] = failure
            self.counts["built" if failure is None else "failed"] += 1
            self._cond.notify_all()

    def _builder(self) -> None:
        """One builder: a runner for as long as it lives, the next one after a build that killed it (a runner
        that cannot start twice running ends the builder: the GPU runner builds what is left)."""
        false_starts = 0
        try:
            while not self._closed and time.monotonic() < self.deadline and false_starts < 2:
                started = False
                try:
                    with self._start() as client:
                        keys = _gemm_keys(client)
                        started, false_starts = True, 0
                        while (build := self._next(client)) is not None:
                            self._build(client, keys, build)
                        return
                except RunnerError:
                    false_starts += not started  # a crash under a build: a fresh runner takes the next config
        finally:
            with self._cond:
                self._alive -= 1
                self._cond.notify_all()

    def _build(self, client: BuildClient, keys: dict[str, list[tuple[str, int, int, int]]],
               build: Build) -> None:
        epilogue, config = build
        try:
            client.set_schedule({key: config for key in keys.get(epilogue, [])})
            client.run(["build"], keep=[], trace=False)
        except CandidateRaised as exc:
            self._done(build, f"does not build for sm_90a: {last_line(exc)}")
        except RunnerCrashed as exc:
            self._done(build, f"its sm_90a build killed the process: {last_line(exc)}")
            raise
        except RunnerError:  # cancelled, or out of time: not built, and no failure of the config's
            with self._cond:
                self._building.pop(build, None)
                self.counts["skipped"] += 1
                self._cond.notify_all()
            raise
        else:
            self._done(build, None)


def _gemm_keys(client: BuildClient) -> dict[str, list[tuple[str, int, int, int]]]:
    """Per epilogue, the schedule keys of its gemm calls at the small shape (one traced call: the op log)."""
    keys: dict[str, list[tuple[str, int, int, int]]] = {}
    for op in (client.run(["build"], keep=[]).ops or [[]])[0]:
        if "gemm" in op and isinstance(op.get("epilogue"), str):
            keys.setdefault(op["epilogue"], []).append((op["epilogue"], *op["gemm"]))
    return keys


def build_line(counts: Mapping[str, int]) -> str:
    """The builders' work in one line, as the run's progress and ``bench --tune`` print it."""
    queued, built, failed, skipped = (counts.get(k, 0) for k in ("queued", "built", "failed", "skipped"))
    return (f"builds for sm_90a on the CPU: {queued} queued, {built} built, {failed} failed, "
            f"{skipped} skipped (the search ended first)")
