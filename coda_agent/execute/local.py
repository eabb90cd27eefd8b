"""The local executor (the default): this host's CPUs and GPUs, no other software.

CPU jobs run on threads of this process (each verification's candidate runs in its own sandboxed runner
anyway). GPU jobs run on one worker per visible GPU: with one GPU, this process, as a single-GPU run always
has; with several, one persistent process per GPU that sees only its own (``CUDA_VISIBLE_DEVICES``), because
the checker's ``cuda`` device and every runner it starts follow that variable.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ..verifier import cancel_all, verify
from ..verifier.verdict import Verdict
from .core import Executor, Job, VerifyFn, Worker, run_job


def visible_gpus() -> list[str]:
    """This process's GPUs, as ``CUDA_VISIBLE_DEVICES`` names them to a child process."""
    import torch

    if not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [d.strip() for d in given.split(",") if d.strip()] if given else [str(i) for i in range(count)]
    return names[:count]


def _pin(device: str) -> None:
    """In a GPU worker process, before anything initialises CUDA: this process sees one GPU."""
    os.environ["CUDA_VISIBLE_DEVICES"] = device


class LocalExecutor(Executor):
    """``cpu_workers`` CPU jobs at once; per GPU, ``gpu_slots`` untimed jobs or one timed job."""

    kind = "local"

    def __init__(self, *, cpu_workers: int = 2, gpu_slots: int = 1, gpus: Sequence[str] | None = None,
                 verify_fn: VerifyFn = verify) -> None:
        devices = visible_gpus() if gpus is None else list(gpus)
        workers = [Worker("cpu", gpu=False, slots=max(1, cpu_workers))]
        workers += [Worker(f"gpu{i}", gpu=True, slots=max(1, gpu_slots),
                           device=d) for i, d in enumerate(devices)]
        super().__init__(workers)
        self.verify_fn = verify_fn
        #: With one GPU its jobs run in this process too; with several, each GPU has a pool of processes.
        self.in_process_gpu = len(devices) == 1
        threads = max(1, cpu_workers) + (max(1, gpu_slots) if self.in_process_gpu else 0)
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="verify")
        self._pools: dict[str, ProcessPoolExecutor] = {}

    def describe(self) -> str:
        cpu = next(w for w in self.workers if not w.gpu)
        gpus = [f"{w.name} (CUDA_VISIBLE_DEVICES={w.device})" for w in self.workers if w.gpu]
        return f"local: {cpu.slots} CPU worker{'s' if cpu.slots != 1 else ''}" + (", " + ", ".join(gpus)
                                                                                  if gpus else "")

    def _start(self, worker: Worker, job: Job) -> Future[Verdict]:
        if not worker.gpu or self.in_process_gpu:
            return self._threads.submit(run_job, job, self.verify_fn)
        pool = self._pools.get(worker.name)
        if pool is None:
            pool = self._pools[worker.name] = ProcessPoolExecutor(
                max_workers=worker.slots, mp_context=multiprocessing.get_context("spawn"), initializer=_pin,
                initargs=(worker.device,),
            )
        future = pool.submit(run_job, job, self.verify_fn)
        future.add_done_callback(lambda f: self._replace_if_broken(worker.name, pool, f))
        return future

    def _replace_if_broken(self, name: str, pool: ProcessPoolExecutor, future: Future[Verdict]) -> None:
        """A GPU worker process died: the next job on that GPU starts a fresh pool."""
        if not future.cancelled() and isinstance(future.exception(),
                                                 BrokenProcessPool) and self._pools.get(name) is pool:
            del self._pools[name]
            pool.shutdown(wait=False, cancel_futures=True)

    def _end_running(self) -> None:
        cancel_all()  # this process's runners: their verifications return at once as cancelled
        for pool in list(self._pools.values()):
            # ProcessPoolExecutor has no public way to end running work (before Python 3.14's
            # terminate_workers).
            for process in list(pool._processes.values()):
                process.terminate()

    def _shutdown(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        self._pools.clear()
