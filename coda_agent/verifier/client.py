"""The checker's handle on one sandboxed runner: start it, talk to it, bound it in time, end it.

Everything the runner says is data: each reply is validated as the kind its request expects
(:func:`~coda_agent.runner.protocol.parse_reply`), its tensors as their file allows; its exit code and its
files mean nothing to the verdict. A runner that dies or sends a malformed reply becomes
:class:`RunnerCrashed`, one that overruns the deadline is killed and becomes :class:`RunnerTimedOut`, and a
``forward`` that raised is :class:`CandidateRaised`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..primitives.configs import Schedule, schedule_to_wire
from ..runner.protocol import (
    CallOps,
    Channel,
    Discovered,
    DiscoverRequest,
    Done,
    Dropped,
    DropRequest,
    ExitRequest,
    ExpectedReply,
    Failed,
    Fetched,
    FetchRequest,
    InputsRequest,
    LoadRequest,
    MetaTensor,
    ProtocolError,
    Ran,
    Request,
    ResetRequest,
    RunRequest,
    ScheduleRequest,
    Started,
    Synced,
    create_file,
    dtype_name,
    parse_reply,
    read_tensors,
    read_text,
    write_tensors,
)
from ..runner.window import WINDOW_FD_ENV, default_window_bytes, open_window
from .bytecode import runner_prefix
from .sandbox import Limits, Sandbox, Spec, detect, kill
from .scratch import remove_tree, scratch_prefix

STDERR_TAIL = 4000
#: The largest kernel trace the checker reads back from a runner (a batch's trace of kernel events is tens of
#: KB).
MAX_TRACE_BYTES = 16 * 1024 * 1024
#: Sets rlimits and the parent-death signal, then execs the real command (no preexec_fn: the caller has
#: threads).
_SHIM = (
    "import ctypes,json,os,resource,signal,sys\n"
    "lim=json.loads(sys.argv[1])\n"
    "ctypes.CDLL(None).prctl(1,signal.SIGKILL,0,0,0)\n"
    "for k,v in lim.items():\n"
    " r=getattr(resource,k);s,h=resource.getrlimit(r)\n"
    " v=v if h==resource.RLIM_INFINITY else min(v,h)\n"
    " resource.setrlimit(r,(v,v))\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)


#: Every runner alive in this process, so that an interrupted caller can end them all at once.
_LIVE: set[RunnerClient] = set()
_LIVE_LOCK = threading.Lock()


def cancel_all() -> int:
    """End every runner of this process (Ctrl-C, SIGTERM): their verifications return at once as cancelled."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for client in live:
        client.cancel()
    return len(live)


class RunnerError(Exception):
    """The runner did not answer as asked."""


class RunnerCrashed(RunnerError):
    pass


def last_line(exc: Exception) -> str:
    """The last non-empty line of a failure's message, cut to 200 characters (a dead runner's: its abort's
    reason)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no message"


class RunnerTimedOut(RunnerError):
    pass


class RunnerCancelled(RunnerError):
    """The caller was interrupted and ended the runner."""


class CandidateRaised(RunnerError):
    """``forward`` (or the import) raised; the message is the candidate's own trace. ``contract``: what it
    raised was the primitives' EpilogueError (a misuse of the contract, not a failure to run)."""

    def __init__(self, message: str, call: int | None = None, contract: bool = False) -> None:
        super().__init__(message)
        self.call = call
        self.contract = contract


@dataclass
class Batch:
    """What one ``run`` request came back with; ``wall_s`` is the checker's own clock around it."""

    times_us: list[float]
    wall_s: float
    host_us: list[float] = field(default_factory=list)  # the runner's host clock around each forward()
    trace: dict[str, Any] | None = None
    ops: list[CallOps] | None = None  # None: a batch run without the op log


@dataclass
class CallOutput:
    """The kept output of one call, as the checker rebuilt it from the runner's bytes."""

    call: int
    kind: str
    tensors: dict[str, torch.Tensor]
    bad: dict[str, str]
    storages: dict[str, int]
    inputs_modified: list[str]
    keys: list[str]


class RunnerClient:
    """One runner process in the sandbox, for one backend on one device."""

    def __init__(
        self, source: str, *, backend: str, device: str, constants: dict[str, Any], deadline: float,
        cache_dir: Path | None = None, hidden: tuple[Path, ...] = (), sandbox: Sandbox | None = None,
        window_bytes: int | None = None,
    ) -> None:
        self.sandbox = sandbox or detect()
        self.device, self.deadline = device, deadline
        # 0700: no other user can plant files in it
        self.scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix()))
        with os.fdopen(create_file(self.scratch / "candidate.py"), "w") as f:
            f.write(source)
        # where tensors cross that fit it (None: tensor files only); the runner inherits its descriptor
        self.window = open_window(window_bytes if window_bytes is not None else default_window_bytes(device))
        env = {"QUACK_CACHE_DIR": str(cache_dir)} if cache_dir else {}
        if self.window is not None:
            env[WINDOW_FD_ENV] = str(self.window.fd)
        if backend == "quack-compile":
            env.update({"QUACK_ARCH": "90", "CUTE_DSL_ARCH": "sm_90a"})
        bytecode = runner_prefix()
        if bytecode:
            env["PYTHONPYCACHEPREFIX"] = str(bytecode)
        spec = Spec(
            scratch=self.scratch, writable=(cache_dir,) if cache_dir else (), hidden=hidden,
            readable=(bytecode,) if bytecode else (),
            gpu=device == "cuda", env=env, limits=Limits(memory_bytes=None) if device == "cuda" else Limits(),
        )
        argv = [sys.executable, "-m", "coda_agent.runner"]
        limits = {
            "RLIMIT_CPU": spec.limits.cpu_seconds, "RLIMIT_CORE": 0, "RLIMIT_NOFILE": spec.limits.open_files,
            "RLIMIT_FSIZE": spec.limits.file_bytes, "RLIMIT_NPROC": spec.limits.processes,
            **({"RLIMIT_AS": spec.limits.memory_bytes} if spec.limits.memory_bytes else {}),
        }
        shim = [sys.executable, "-S", "-c", _SHIM, json.dumps(limits)]
        self._timed_out = self._cancelled = False
        #: The largest peak device memory the runner reported (None: it reported none, e.g. on the CPU).
        self.peak_bytes: int | None = None
        self._op = ""
        self._tail = bytearray()
        try:
            self.proc = self.sandbox.popen(argv, spec, prefix=shim, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           pass_fds=(self.window.fd,) if self.window is not None else ())
        except BaseException:  # no runner: its folder and its window go now
            remove_tree(self.scratch)
            if self.window is not None:
                self.window.close()
            raise
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self.channel = Channel(self.proc.stdout, self.proc.stdin)
        self._stderr = threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True)
        self._stderr.start()
        self._watchdog = threading.Thread(target=self._watch, daemon=True)
        self._closed = threading.Event()
        self._watchdog.start()
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._request(LoadRequest(backend=backend, device=device, constants=constants), Done)
        except BaseException:
            self.close()
            raise

    # --- plumbing --------------------------------------------------------------------------------

    def _drain(self, stream: Any) -> None:
        for chunk in iter(lambda: stream.read(4096), b""):
            self._tail += chunk
            del self._tail[:-STDERR_TAIL]

    def _watch(self) -> None:
        while not self._closed.wait(0.2):
            if time.monotonic() > self.deadline:
                self._timed_out = True
                kill(self.proc)
                return

    def stderr_tail(self) -> str:
        return self._tail.decode(errors="replace")[-1500:]

    def _request(self, request: Request, expected: type[ExpectedReply]) -> ExpectedReply:
        try:
            self.channel.send(request)
        except ProtocolError as exc:
            self._fail(exc)
        self._op = request.op
        return self._reply(expected)

    def _reply(self, expected: type[ExpectedReply]) -> ExpectedReply:
        """The runner's next reply, as the ``expected`` kind; a failure it reports is raised as what it
        was."""
        try:
            message = self.channel.recv()
        except ProtocolError as exc:
            self._fail(exc)
        try:
            reply = parse_reply(message, expected)
        except ProtocolError as exc:
            self._stopped()
            raise RunnerCrashed(f"the runner's reply to {self._op!r} is malformed: {exc}") from None
        if reply.peak_bytes is not None:
            self.peak_bytes = max(reply.peak_bytes, self.peak_bytes or 0)
        if isinstance(reply, Failed):
            if reply.harness:
                raise RunnerCrashed(f"the runner failed while handling {self._op!r}:\n{reply.error}")
            raise CandidateRaised(reply.error, reply.call, reply.contract)
        return reply

    def cancel(self) -> None:
        self._cancelled = True
        kill(self.proc)

    def _stopped(self) -> None:
        """Raise why the checker ended the runner, if it did (a broken channel is then no crash)."""
        if self._cancelled:
            raise RunnerCancelled("the verification was cancelled (the caller was interrupted)") from None
        if self._timed_out:
            raise RunnerTimedOut("the candidate did not finish in time") from None

    def _fail(self, exc: Exception) -> Any:
        self._stopped()
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._stderr.join(timeout=1)
        raise RunnerCrashed(f"the runner process died (exit {code}): {exc}\n{self.stderr_tail()}") from None

    # --- requests --------------------------------------------------------------------------------

    def set_schedule(self, table: Schedule) -> None:
        """Run the calls that follow under the harness's schedule (precedence over the candidate's own
        configs)."""
        self._request(ScheduleRequest(entries=schedule_to_wire(table)), Done)

    def discover(self, shapes: Mapping[str, tuple[Sequence[int], torch.dtype]]) -> CallOps:
        """The op log of one forward() on meta tensors of these shapes and dtypes (its gemm calls answered
        with shapes only); CandidateRaised when forward() cannot run without values."""
        inputs = {k: MetaTensor(shape=list(shape), dtype=dtype_name(dtype)) for k, (shape,
                                                                                    dtype) in shapes.items()}
        ops = self._request(DiscoverRequest(inputs=inputs), Discovered).ops
        return ops[0] if ops else []

    def prepare_window(self, nbytes: int) -> None:
        """Start making the window's pages for ``nbytes`` of tensors to come (:meth:`.Window.make_pages`),
        beside whatever this client does next; nothing where there is no window."""
        if self.window is not None:
            self.window.make_pages(nbytes)

    def put(self, set_id: str, tensors: dict[str, torch.Tensor]) -> None:
        refs = self.window.write(tensors) if self.window is not None else None
        if refs is not None:
            self._request(InputsRequest(set=set_id, file="", tensors=refs, window=True), Done)
            return
        path = self.scratch / f"in_{set_id}.bin"
        try:
            refs = write_tensors(path, tensors)
        except ProtocolError as exc:
            raise RunnerCrashed(f"the runner's scratch folder was tampered with: {exc}") from None
        self._request(InputsRequest(set=set_id, file=path.name, tensors=refs), Done)

    def drop(self, set_ids: list[str]) -> dict[str, list[str]]:
        """Forget input sets; returns, per set, the inputs forward() modified while it was held."""
        return self._request(DropRequest(sets=set_ids), Dropped).modified

    def reset(self) -> None:
        """Begin another stage in this runner: its peak device memory counts afresh."""
        self._request(ResetRequest(), Done)
        self.peak_bytes = None

    def run(self, calls: list[str], keep: list[int], dry: bool = False, trace: bool = True) -> Batch:
        """One batch; ``wall_s`` runs from the runner's ``started`` to its ``synced`` message."""
        self._request(RunRequest(calls=calls, keep=keep, dry=dry, trace=trace), Started)
        t0 = time.perf_counter()
        self._reply(Synced)
        wall = time.perf_counter() - t0
        reply = self._reply(Ran)
        if len(reply.times_us) != len(calls):
            raise RunnerCrashed(f"the runner reported {len(reply.times_us)} timings for {len(calls)} calls")
        trace_data = None
        if reply.trace and trace and self.device == "cuda":  # a trace only where one was asked for
            path = self.scratch / Path(reply.trace).name
            try:
                trace_data = json.loads(read_text(path, MAX_TRACE_BYTES))
            except (ProtocolError, ValueError, RecursionError) as exc:
                raise RunnerCrashed(f"the runner's kernel trace is unusable: {type(exc).__name__}") from None
            if not isinstance(trace_data, dict):
                raise RunnerCrashed("the runner's kernel trace is not a trace")
            with contextlib.suppress(OSError):  # whatever the runner did to it since, it has been read
                path.unlink()
        # a diagnostic: one time per call, or none
        hosts = reply.host_us if len(reply.host_us) == len(calls) else []
        return Batch(times_us=reply.times_us, wall_s=wall, host_us=hosts, trace=trace_data, ops=reply.ops)

    def fetch(self, max_bytes: int) -> list[CallOutput]:
        """The kept calls' outputs; RunnerCrashed when their bytes add up to more than ``max_bytes``, or their
        file is not a plain file of the runner's scratch folder."""
        reply = self._request(FetchRequest(), Fetched)
        if reply.window:
            if self.window is None:
                raise RunnerCrashed("the runner's outputs are unusable: it named a window it was never given")
            try:
                flat = self.window.read(reply.tensors, self.device, max_bytes=max_bytes)
            except (ProtocolError, ValueError, RuntimeError) as exc:
                raise RunnerCrashed(f"the runner's outputs are unusable: {exc}") from None
        else:
            path = self.scratch / Path(reply.file).name
            try:
                flat = read_tensors(path, reply.tensors, self.device, max_bytes=max_bytes)
            except (ProtocolError, ValueError) as exc:
                raise RunnerCrashed(f"the runner's outputs are unusable: {exc}") from None
            with contextlib.suppress(OSError):
                path.unlink()
        outs = []
        for entry in reply.calls:
            prefix = f"{entry.call}/"
            outs.append(CallOutput(
                call=entry.call, kind=entry.kind,
                tensors={k.removeprefix(prefix): v for k, v in flat.items() if k.startswith(prefix)},
                bad=entry.bad, storages=entry.storages, inputs_modified=entry.inputs_modified,
                keys=entry.keys,
            ))
        return outs

    def close(self) -> None:
        self._closed.set()
        with _LIVE_LOCK:
            _LIVE.discard(self)
        with contextlib.suppress(ProtocolError):
            self.channel.send(ExitRequest())
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2)
        kill(self.proc)
        if self.window is not None:
            self.window.close()
            self.window = None
        self.channel.close()
        self._stderr.join(timeout=1)
        remove_tree(self.scratch)

    def __enter__(self) -> RunnerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
