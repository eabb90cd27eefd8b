"""The Ray executor (the ``coda-agent[ray]`` extra): verifications spread over a Ray cluster's GPUs and CPUs.

One long-lived actor per GPU (``num_gpus=1``: Ray gives each its own ``CUDA_VISIBLE_DEVICES``) runs the GPU
jobs; CPU jobs are Ray tasks made GPU-blind explicitly, since Ray leaves ``CUDA_VISIBLE_DEVICES`` unset for
them and they would see every GPU of their node. Every worker runs the verifier as the local executor does,
its sandboxed runner included. Which job starts when stays with :class:`~.core.Executor`; Ray places the
workers, ships jobs and verdicts, and reports a worker that dies: a dead actor is restarted, and the job it
held comes back as an infra-error verdict. Every node needs coda-agent installed and the tasks' files at the
same paths (one host, or a shared filesystem).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from concurrent.futures import Future
from types import ModuleType
from typing import Any

from ..verifier import cancel_all, verify
from ..verifier.verdict import Verdict
from .core import Executor, ExecutorError, Job, VerifyFn, Worker, run_job

INSTALL = "pip install 'coda-agent[ray]'"
#: How long the GPU actors may take to start (a busy cluster may not have its GPUs free).
GPU_WORKERS_START_S = 120.0
#: Ray on Linux swaps a 127.0.0.1 node address for the host's reachable one unless this is "0" when Ray is
#: imported.
LOOPBACK_GATE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def import_ray(loopback: bool = False) -> ModuleType:
    """Ray, or one line saying how to install it. ``loopback``: a cluster this process starts binds to
    127.0.0.1, which Ray reads from the environment when it is first imported."""
    if loopback and "ray" not in sys.modules:
        os.environ.setdefault(LOOPBACK_GATE, "0")
    try:
        import ray
    except ImportError:
        raise ExecutorError(f"--executor ray needs Ray, which is not installed here: {INSTALL}") from None
    return ray


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Connect to the cluster's port first: ``ray.init`` on an address nothing answers retries for minutes."""
    if address in ("auto", "local"):
        return  # Ray itself answers at once: a cluster on this host, or a new one
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ExecutorError(f"--address {address}: expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ExecutorError(f"cannot reach a Ray cluster at {address}: {exc.strerror or exc}") from None


class GpuWorker:
    """A Ray actor on one GPU: verifies the GPU jobs sent to it, for as long as the executor lives."""

    def __init__(self, verify_fn: VerifyFn) -> None:
        self.verify_fn = verify_fn

    def info(self) -> dict[str, str]:
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
        return {"host": socket.gethostname(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                "device": name}

    def verify(self, job: Job) -> Verdict:
        return run_job(job, self.verify_fn)

    def cancel(self) -> int:
        return cancel_all()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class RayExecutor(Executor):
    """``address`` as ``ray.init`` takes it (HOST:PORT, ray://HOST:PORT, auto); none starts a private
    single-node cluster bound to 127.0.0.1. Per GPU, ``gpu_slots`` untimed jobs or one timed job."""

    kind = "ray"

    def __init__(self, address: str | None = None, *, gpu_slots: int = 1,
                 verify_fn: VerifyFn = verify) -> None:
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        ray = import_ray(loopback=self.address is None)
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            self._connect()
        try:
            workers, self._actors = self._start_workers(max(1, gpu_slots), verify_fn)
        except Exception:
            if self._owns:
                ray.shutdown()
            raise
        super().__init__(workers)
        self.verify_fn = verify_fn
        self._cpu_task = ray.remote(run_job).options(
            num_cpus=1, max_retries=0, runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": ""}},
        )
        self._refs: dict[Any, Worker] = {}

    def _connect(self) -> None:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if self.address:
            check_reachable(self.address)
            kwargs["address"] = self.address
        else:  # a cluster of our own: on loopback only
            kwargs["_node_ip_address"] = "127.0.0.1"
        try:
            self._ray.init(**kwargs)
        except Exception as exc:  # ConnectionError, RuntimeError, ValueError: Ray's own words, on one line
            where = f" at {self.address}" if self.address else ""
            raise ExecutorError(f"cannot start Ray{where}: {_first_line(exc)}") from None

    def _start_workers(self, gpu_slots: int, verify_fn: VerifyFn) -> tuple[list[Worker], dict[str, Any]]:
        """The CPU workers (every CPU of the cluster) and one actor per GPU that started in time."""
        ray = self._ray
        resources = ray.cluster_resources()
        actor = ray.remote(GpuWorker).options(
            num_gpus=1, num_cpus=0, max_concurrency=gpu_slots + 1, max_restarts=-1, max_task_retries=0,
        )
        handles = [actor.remote(verify_fn) for _ in range(int(resources.get("GPU", 0)))]
        asks = {h.info.remote(): h for h in handles}
        ready, late = ray.wait(list(asks), num_returns=len(asks),
                               timeout=GPU_WORKERS_START_S) if asks else ([], [])
        for ref in late:
            ray.kill(asks[ref])
        infos = sorted(((ray.get(ref), asks[ref]) for ref in ready),
                       key=lambda ih: (ih[0]["host"], ih[0]["cuda"]))
        hosts = {info["host"] for info, _ in infos}
        workers = [Worker("cpu", gpu=False, slots=max(1, int(resources.get("CPU", 1))))]
        actors = {}
        for info, handle in infos:
            name = f"gpu{info['cuda']}" + (f"@{info['host']}" if len(hosts) > 1 else "")
            workers.append(Worker(name, gpu=True, slots=gpu_slots,
                                  device=info["device"] or f"CUDA_VISIBLE_DEVICES={info['cuda']}"))
            actors[name] = handle
        return workers, actors

    def describe(self) -> str:
        cpu = next(w for w in self.workers if not w.gpu)
        gpus = [f"{w.name} ({w.device})" for w in self.workers if w.gpu]
        where = self.address or "a private local cluster"
        return f"ray at {where}: {cpu.slots} CPU{'s' if cpu.slots != 1 else ''}" + (", " + ", ".join(gpus)
                                                                                    if gpus else ", no GPU")

    def _start(self, worker: Worker, job: Job) -> Future[Verdict]:
        if worker.gpu:
            outer: Future[Verdict] = Future()
            threading.Thread(target=self._on_actor, args=(worker, job, outer), name=f"ray-{worker.name}",
                             daemon=True).start()
            return outer
        ref = self._track(self._cpu_task.remote(job, self.verify_fn), worker)
        future: Future[Verdict] = ref.future()
        future.add_done_callback(lambda _: self._forget(ref))
        return future

    def _on_actor(self, worker: Worker, job: Job, outer: Future[Verdict]) -> None:
        """One GPU job; when it killed its actor, the failure is told only once Ray has the actor back, so the
        job after it finds a live actor (a call made while it restarts would fail too)."""
        handle = self._actors[worker.name]
        ref = self._track(handle.verify.remote(job), worker)
        try:
            outer.set_result(self._ray.get(ref))
        except self._ray.exceptions.RayActorError as exc:
            self._wait_for_restart(handle)
            outer.set_exception(exc)
        except Exception as exc:
            outer.set_exception(exc)
        finally:
            self._forget(ref)

    def _wait_for_restart(self, handle: Any) -> None:
        errors = self._ray.exceptions
        deadline = time.monotonic() + GPU_WORKERS_START_S
        while time.monotonic() < deadline:
            try:
                self._ray.get(handle.info.remote(), timeout=10)
                return
            except (errors.ActorUnavailableError, errors.GetTimeoutError):
                time.sleep(0.2)
            except errors.RayActorError:
                return  # gone for good (its node left): the next job on it says so

    def _track(self, ref: Any, worker: Worker) -> Any:
        with self._lock:
            self._refs[ref] = worker
        return ref

    def _forget(self, ref: Any) -> None:
        with self._lock:
            self._refs.pop(ref, None)

    def _end_running(self) -> None:
        with self._lock:
            running = list(self._refs.items())
        for ref, worker in running:
            if worker.gpu:  # a threaded actor's running call cannot be cancelled: its runners can
                self._actors[worker.name].cancel.remote()
            else:
                self._ray.cancel(ref, force=True)

    def _shutdown(self) -> None:
        for handle in self._actors.values():
            self._ray.kill(handle)
        if self._owns:
            self._ray.shutdown()
