"""The tune stage's builds: the configs a shape's search will propose, built for sm_90a by CPU processes side
by side before the GPU times any of them.

A proposal the GPU runner has to build first costs its build (2-7 s on the H200) before its few milliseconds
of timing, one proposal after another. Here :data:`BUILDERS` runners on the ``quack-compile`` backend (QuACK's
compile-only path, no GPU) each take configs off one queue and build them under the harness's schedule at the
task's first small shape: a kernel does not depend on the sizes, and QuACK's compile cache, which the
candidate's runners share (:func:`~.caches.quack_cache_for`), is where the kernels meet, as in QuACK's own
autotuner and its compile pool. The GPU runner then loads each kernel instead of building it.

A build that fails is not proposed at all: one the primitives refuse, or one that takes its process down. A
compiler abort (``std::bad_variant_access`` from a tile QuACK cannot build) costs one builder, which is
started again, and not the search's runner, whose restarts are few.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
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


#: Starts a runner on the compile-only backend with the small shape's inputs put as set ``"build"``.
StartBuilder = Callable[[], AbstractContextManager[BuildClient]]


def build_configs(builds: Iterable[Build], start: StartBuilder, deadline: float,
                  workers: int = BUILDERS) -> dict[Build, str]:
    """Build each (epilogue, config) until ``deadline`` (monotonic); what failed, with why. A build the
    deadline cut off is not a failure (the GPU runner builds it when proposed)."""
    todo: queue.SimpleQueue[Build] = queue.SimpleQueue()
    wanted = list(dict.fromkeys(builds))
    for build in wanted:
        todo.put(build)
    failed: dict[Build, str] = {}
    threads = [threading.Thread(target=_builder, args=(todo, start, deadline, failed), daemon=True)
               for _ in range(min(workers, len(wanted)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 5.0)
    return dict(failed)


def _builder(todo: queue.SimpleQueue[Build], start: StartBuilder, deadline: float,
             failed: dict[Build, str]) -> None:
    """One builder: a runner for as long as it lives, the next one after a build that killed it (a runner that
    cannot start twice running ends the builder: the GPU runner builds what is left)."""
    false_starts = 0
    while time.monotonic() < deadline and not todo.empty() and false_starts < 2:
        started = False
        try:
            with start() as client:
                keys = _gemm_keys(client)
                started, false_starts = True, 0
                while time.monotonic() < deadline:
                    try:
                        epilogue, config = build = todo.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        client.set_schedule({key: config for key in keys.get(epilogue, [])})
                        client.run(["build"], keep=[], trace=False)
                    except CandidateRaised as exc:
                        failed[build] = f"does not build for sm_90a: {last_line(exc)}"
                    except RunnerCrashed as exc:
                        failed[build] = f"its sm_90a build killed the process: {last_line(exc)}"
                        raise
        except RunnerError:
            false_starts += not started  # a crash under a build: a fresh runner takes the next config


def _gemm_keys(client: BuildClient) -> dict[str, list[tuple[str, int, int, int]]]:
    """Per epilogue, the schedule keys of its gemm calls at the small shape (one traced call: the op log)."""
    keys: dict[str, list[tuple[str, int, int, int]]] = {}
    for op in (client.run(["build"], keep=[]).ops or [[]])[0]:
        if "gemm" in op and isinstance(op.get("epilogue"), str):
            keys.setdefault(op["epilogue"], []).append((op["epilogue"], *op["gemm"]))
    return keys
