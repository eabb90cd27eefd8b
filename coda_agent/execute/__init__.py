"""Where verifications run: the seam between the verifier and its callers (the bench, the agent loop, sweeps).

A :class:`Job` is one ``verify()`` call. An executor places each job on a worker and hands back a future of
its verdict; inside the worker the verifier runs unchanged (its checker there, the candidate in the sandboxed
runner it starts), so a verdict does not depend on where it was made. Both executors admit jobs by one rule
(:class:`Worker`): CPU-stage jobs (the emulator, the sm_90a compile) on the CPU workers, as many at once as
there are; GPU jobs on one worker per GPU, a few untimed ones at a time or a timed one alone, so timings never
overlap on a device.

``local`` (:mod:`.local`, the default) is this host; ``ray`` (:mod:`.on_ray`, the ``coda-agent[ray]`` extra)
is a Ray cluster, with one long-lived actor per GPU and GPU-blind CPU tasks.
"""

from __future__ import annotations

from .core import Executor, ExecutorError, Job, OnStart, VerifyFn, Worker
from .local import LocalExecutor

__all__ = ["EXECUTORS", "Executor", "ExecutorError", "Job", "LocalExecutor", "OnStart", "VerifyFn", "Worker",
           "open_executor"]

EXECUTORS = ("local", "ray")


def open_executor(kind: str = "local", *, address: str | None = None, cpu_workers: int = 2,
                  gpu_slots: int = 1) -> Executor:
    """The executor a command asked for (``--executor``, ``--address``); :class:`ExecutorError` says why
    not."""
    if kind == "local":
        if address:
            raise ExecutorError("--address names a Ray cluster: it goes with --executor ray")
        return LocalExecutor(cpu_workers=cpu_workers, gpu_slots=gpu_slots)
    if kind == "ray":
        from .on_ray import RayExecutor

        return RayExecutor(address, gpu_slots=gpu_slots)
    raise ExecutorError(f"unknown executor {kind!r} (known: {', '.join(EXECUTORS)})")
