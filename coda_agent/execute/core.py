"""Jobs, workers and the admission rule every executor shares; a backend only starts a job on a worker."""

from __future__ import annotations

import itertools
import threading
import traceback
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from types import TracebackType

from ..tasks.model import Task
from ..verifier import verify
from ..verifier.plan import Plan
from ..verifier.verdict import Outcome, Verdict

VerifyFn = Callable[[Task, str, Plan], Verdict]
#: Called with the worker's name when a job starts on it (in the executor's thread: keep it short).
OnStart = Callable[[str], None]


class ExecutorError(Exception):
    """An executor cannot start (Ray missing, its cluster unreachable): one line for the user."""


@dataclass(frozen=True)
class Job:
    """One verification: the plan :func:`~coda_agent.verifier.verify` takes, and what a display calls it."""

    task: Task
    source: str
    plan: Plan
    label: str = ""
    #: Its GPU to itself though nothing is timed: the rerun of a job that ran out of memory beside others.
    alone: bool = False

    @property
    def exclusive(self) -> bool:
        """Whether it must have its device to itself: timed jobs, and reruns alone."""
        return self.plan.timed or self.alone

    def failed(self, reason: str) -> Verdict:
        """The verdict of a job the harness could not see through (the candidate is not to blame)."""
        return Verdict(task=self.task.name, task_version=self.task.version, backend=self.plan.backend,
                       outcome=Outcome.INFRA_ERROR, reason=reason)


def run_job(job: Job, verify_fn: VerifyFn = verify) -> Verdict:
    """What every worker runs: the verifier, unchanged (its sandboxed runner included), on one job."""
    try:
        return verify_fn(job.task, job.source, job.plan)
    except Exception as exc:  # the harness failed, not the candidate
        return job.failed("the verifier itself failed:\n"
                          + "".join(traceback.format_exception_only(type(exc), exc)).strip())


@dataclass
class Worker:
    """Where jobs run: the CPU workers together, or one GPU; and what runs there now."""

    name: str
    gpu: bool
    #: Jobs at once (on a GPU: untimed ones; a timed job has its device to itself).
    slots: int
    #: Which GPU, for a display: its ``CUDA_VISIBLE_DEVICES`` or its name.
    device: str = ""
    running: dict[int, Job] = field(default_factory=dict)

    def admits(self, job: Job) -> bool:
        if any(j.exclusive for j in self.running.values()):
            return False
        return not self.running if job.exclusive else len(self.running) < self.slots

    def doing(self) -> str:
        """``gpu0 #3 (timing)``, ``cpu #1 #2``, ``gpu1 idle``."""
        if not self.running:
            return f"{self.name} idle"
        labels = " ".join(j.label or j.task.name for j in self.running.values())
        jobs = self.running.values()
        timing, alone = any(j.plan.timed for j in jobs), any(j.alone for j in jobs)
        return f"{self.name} {labels}" + (" (timing)" if timing else " (alone)" if alone else "")


@dataclass
class _Pending:
    id: int
    job: Job
    future: Future[Verdict]
    on_start: OnStart | None
    #: A rerun alone: its future is running already.
    rerun: bool = False


class Executor(ABC):
    """Admits jobs onto workers in the order they came; subclasses start a job on a worker (:meth:`_start`).

    A GPU job goes to a GPU worker (to the CPU workers where there is none: the verifier then says so, as it
    would anywhere); any other job to the CPU workers. A job that must wait holds back the later jobs of its
    kind, so a timed job is not starved by untimed ones. A job that ran out of GPU memory while it shared its
    GPU is run again alone, and that verdict is its own. Every future resolves to a verdict: a worker that
    dies or cannot start gives an infra-error verdict naming it.
    """

    kind = ""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self._lock = threading.Lock()
        self._queue: deque[_Pending] = deque()
        self._ids = itertools.count()
        self._closed = False
        #: Jobs that had company on their GPU at some point of their run.
        self._shared: set[int] = set()

    # --- what a backend provides ------------------------------------------------------------------

    @abstractmethod
    def _start(self, worker: Worker, job: Job) -> Future[Verdict]:
        """Run ``job`` on ``worker`` (admitted there already)."""

    @abstractmethod
    def _end_running(self) -> None:
        """End the jobs running now (their futures then resolve at once)."""

    @abstractmethod
    def _shutdown(self) -> None:
        """Let go of the workers."""

    @abstractmethod
    def describe(self) -> str:
        """One line for a command's header: where verifications run."""

    # --- the seam ----------------------------------------------------------------------------------

    def submit(self, job: Job, on_start: OnStart | None = None) -> Future[Verdict]:
        future: Future[Verdict] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the {self.kind} executor is closed")
            self._queue.append(_Pending(next(self._ids), job, future, on_start))
        self._pump()
        return future

    def activity(self) -> str:
        """``gpu0 #3 (timing) · gpu1 idle · cpu #4 #5 · 2 queued``, for a live display."""
        with self._lock:
            parts = [w.doing() for w in self.workers if w.gpu or w.running
                     or not any(v.gpu for v in self.workers)]
            waiting = len(self._queue)
        return " · ".join(parts + ([f"{waiting} queued"] if waiting else []))

    def cancel(self) -> None:
        """Drop the queued jobs (their futures are cancelled) and end the running ones (Ctrl-C, SIGTERM)."""
        with self._lock:
            queued = list(self._queue)
            self._queue.clear()
        for pending in queued:
            if pending.rerun:
                pending.future.set_result(pending.job.failed("cancelled before its rerun alone on a GPU"))
            else:
                pending.future.cancel()
        self._end_running()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._shutdown()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.cancel()
        self.close()

    # --- admission ---------------------------------------------------------------------------------

    def _places(self, job: Job) -> list[Worker]:
        gpus = [w for w in self.workers if w.gpu]
        return gpus if job.plan.needs_gpu and gpus else [w for w in self.workers if not w.gpu]

    def _pump(self) -> None:
        """Start every queued job that a worker admits now."""
        started: list[tuple[_Pending, Worker]] = []
        with self._lock:
            held: set[bool] = set()
            for pending in list(self._queue):
                places = self._places(pending.job)
                kind = places[0].gpu if places else False
                if kind in held:
                    continue
                worker = next((w for w in places if w.admits(pending.job)), None)
                if worker is None:
                    held.add(kind)
                    continue
                self._queue.remove(pending)
                if pending.rerun or pending.future.set_running_or_notify_cancel():
                    worker.running[pending.id] = pending.job
                    if worker.gpu and len(worker.running) > 1:
                        self._shared.update(worker.running)
                    started.append((pending, worker))
        for pending, worker in started:
            self._launch(pending, worker)

    def _launch(self, pending: _Pending, worker: Worker) -> None:
        if pending.on_start is not None:
            pending.on_start(worker.name)
        try:
            inner = self._start(worker, pending.job)
        except Exception as exc:
            self._finish(pending, worker,
                         pending.job.failed(f"could not start on the {worker.name} worker: {exc}"))
            return
        inner.add_done_callback(lambda f: self._finish(pending, worker, _verdict_of(f, pending.job, worker)))

    def _finish(self, pending: _Pending, worker: Worker, verdict: Verdict) -> None:
        with self._lock:
            worker.running.pop(pending.id, None)
            shared = pending.id in self._shared
            self._shared.discard(pending.id)
            again = shared and verdict.out_of_gpu_memory and not self._closed
            if again:
                self._queue.appendleft(_Pending(next(self._ids), replace(pending.job, alone=True),
                                                pending.future, pending.on_start, rerun=True))
        if not again:
            pending.future.set_result(verdict)
        self._pump()


def _verdict_of(future: Future[Verdict], job: Job, worker: Worker) -> Verdict:
    if future.cancelled():
        return job.failed(f"cancelled on the {worker.name} worker")
    exc = future.exception()
    if exc is None:
        return future.result()
    first = (str(exc).strip().splitlines() or [""])[0]
    return job.failed(f"the {worker.name} worker failed while verifying this candidate "
                      f"({type(exc).__name__}: {first})")
