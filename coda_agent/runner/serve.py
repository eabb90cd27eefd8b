"""The candidate runner: ``python -m coda_agent.runner``, started by the checker inside the sandbox.

This is the only process that imports candidate code, and it holds nothing worth stealing or forging: no
task, no reference, no tolerance, no verdict, no secret. It receives input tensors, calls ``forward`` the
way it is told, and sends back what came out (:mod:`.protocol`). Every call is made the same way, checked
or timed: one of the input sets the checker sent (as sent; it must stay unchanged), a marker kernel and an
L2 flush (GPU), CUDA events (GPU) or the host clock (CPU) around the call. The harness learns with each batch
which calls' outputs to keep for the checker; forward() never does.

Its stdout is the protocol; anything the candidate prints goes to stderr, which the checker keeps a
bounded tail of for crash reports.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, NoReturn

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..measure.timing import FLUSH_BYTES, lead_in
from ..primitives import backend
from ..primitives._call import GemmCall
from ..primitives._config import EpilogueError
from ..primitives.configs import ScheduleOverride, chosen_config, config_fields, schedule_from_wire
from .candidate import CandidateModule, candidate_trace
from .protocol import (
    DTYPES,
    CallReport,
    Channel,
    Discovered,
    DiscoverRequest,
    Done,
    Dropped,
    DropRequest,
    ExitRequest,
    Failed,
    Fetched,
    FetchRequest,
    InputsRequest,
    LoadRequest,
    ProtocolError,
    Ran,
    Reply,
    Request,
    ResetRequest,
    RunRequest,
    ScheduleRequest,
    Started,
    Synced,
    parse_request,
    read_tensors,
    write_tensors,
)
from .window import WINDOW_FD_ENV, Window


class OpLog(TorchDispatchMode):
    """Every aten op forward() runs outside ``primitives.gemm``, and every gemm call: its shape and sinks (the
    launch estimate), and its epilogue, mode and the config it ran with (what the tune stage can tune).

    It also refuses a gemm call that reads memory no op wrote (``torch.empty_like(residual)`` as C): that
    launches nothing, so the same kinds of work ran at every shape while a candidate fed the GEMM garbage at
    the bench sizes only, which the meta runs there could not see otherwise (a red-team pass)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No Dynamo-disabling shim around each op's trip through :meth:`__torch_dispatch__` (a few µs per op,
        and nothing under the log is compiled)."""
        return False

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[dict[str, Any]]] = []
        self._recording = False
        # by id, as long as the tensor lives (a tensor's == is element-wise, so no set of tensors)
        self._unwritten: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    @contextmanager
    def call(self) -> Iterator[None]:
        """Log what runs inside this block as one more call."""
        self.calls.append([])
        self._recording = True
        try:
            yield
        finally:
            self._recording = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self._recording:
            self._track_writes(func, args, kwargs or {}, out)
        if self._recording and not func.is_view and func.name() not in UNMARKED_VIEWS:
            values = (*args, *(kwargs.values() if kwargs else ()),
                      *(out if isinstance(out, (tuple, list)) else (out,)))
            numel, nbytes = _sizes(values)
            self.calls[-1].append({"op": func.name(), "numel": numel, "bytes": nbytes})
        return out

    def _track_writes(self, func: Any, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        """Tensors made without values join the unwritten ones; a tensor an op writes (in place, or its
        ``out=``), or whose base it writes through a view, leaves them."""
        if func.overloadpacket.__name__ in UNINITIALISED:
            self._unwritten[id(out)] = out
            return
        if not self._unwritten:
            return
        written = [args[0]] if func.overloadpacket.__name__.endswith("_") and args else []
        target = kwargs.get("out")
        written += list(target) if isinstance(target, (tuple, list)) else [target]
        for t in written:
            for u in (t, t._base) if isinstance(t, torch.Tensor) else ():
                if u is not None and self._unwritten.get(id(u)) is u:
                    del self._unwritten[id(u)]

    def _unwritten_reads(self, call: GemmCall) -> list[str]:
        """The operands of ``call`` that are (views of) memory no op wrote."""
        named = {"A": call.A, "B": call.B, "C": call.C, **{k: o.value for k, o in call.operands.items()},
                 **call.indices}
        return [k for k, t in named.items() if isinstance(t, torch.Tensor)
                and any(u is not None and self._unwritten.get(id(u)) is u for u in (t, t._base))]

    def wrap_backend(
        self, run: Callable[[GemmCall], dict[str, torch.Tensor]]
    ) -> Callable[[GemmCall], dict[str, torch.Tensor]]:
        def observed(call: GemmCall) -> dict[str, torch.Tensor]:
            # nothing to look up outside a logged call's lifetime: timed calls pay one truth test
            if self._unwritten and (unwritten := self._unwritten_reads(call)):
                raise EpilogueError(f"gemm() reads {', '.join(unwritten)} from memory no op wrote "
                                    "(torch.empty or empty_like, never filled): pass tensors that hold "
                                    "values")
            if self._recording:
                config = chosen_config(call)  # the config the GPU runs it with
                self.calls[-1].append({
                    "gemm": [call.m, call.n, int(call.A.shape[1])],
                    "sinks": sorted(type(s).__name__ for s in call.epi.sinks.values()), "mode": call.epi.mode,
                    "epilogue": call.epi.name, "outputs": len(call.epi.outputs), "store_d": call.store_d,
                    "b_major": call.b_major, "reads_tiles": call.reads_tiles,
                    "tile_n_multiple": call.tile_n_multiple,
                    "config": None if config is None else config_fields(config), "bytes": call.hbm_bytes(),
                    "operand_copies": call.operand_copies,
                })
            with torch._C._DisableTorchDispatch():  # the backend's own ops skip the log, and its Python cost
                return run(call)

        return observed


#: The aten ops that make a tensor without writing its values.
#: Ops that return a view of their input but whose schema does not say so (``reshape`` of a tensor it cannot
#: view copies first, logged as that copy, then hands the copy to ``_unsafe_view``): no kernel, like a view.
UNMARKED_VIEWS = frozenset({"aten::_unsafe_view", "aten::_reshape_alias"})
UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"})


def _sizes(values: tuple[Any, ...]) -> tuple[int, int]:
    """Over an aten op's arguments and results (a schema nests tensors one list deep at most: ``Tensor[]``,
    ``Tensor?[]``): the most elements of any one tensor, and the bytes of the distinct tensors, what its
    kernel reads and writes at the least (a reduction of bf16 into FP32 reads 2 bytes an element, whatever it
    accumulates in)."""
    largest, seen = 0, {}
    for v in values:
        for t in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(t, torch.Tensor):
                numel = t.numel()
                largest = max(largest, numel)
                seen[id(t)] = numel * t.element_size()
    return largest, sum(seen.values())


def frozen(value: Any) -> Any:
    """A read-only copy of a constant: dicts, lists and sets, at any depth inside tuples, dicts and lists."""
    if type(value) is dict:
        return MappingProxyType({k: frozen(v) for k, v in value.items()})
    if type(value) in (list, tuple):
        return tuple(frozen(v) for v in value)
    if type(value) is set:
        return frozenset(value)
    return value


def freeze_globals(module: ModuleType) -> None:
    """Module-level containers become read-only, nested ones too (``BOX = ({},)``): no answer can be kept
    across calls in them."""
    for name, value in list(vars(module).items()):
        if not name.startswith("__"):
            setattr(module, name, frozen(value))


class Runner:
    """The runner's state between requests."""

    def __init__(self, scratch: Path, window: Window | None = None) -> None:
        self.scratch = scratch
        #: The memory both sides map (a GPU runner's), where tensors cross that fit it; else tensor files.
        self.window = window
        self.device = "cpu"
        self.candidate: CandidateModule | None = None
        self.sets: dict[str, dict[str, torch.Tensor]] = {}
        self.constants: dict[str, Any] = {}
        self.snapshots: dict[str, dict[str, torch.Tensor]] = {}
        self.kept: list[tuple[int, Any, str]] = []
        self.oplog = OpLog()
        self.override = ScheduleOverride()
        self.batches = 0
        self.channel: Channel | None = None
        self._flush: torch.Tensor | None = None
        #: The backend's first-call imports, under way beside the requests that send the inputs
        #: (:meth:`load`); whatever runs forward() waits for them first.
        self._preload: threading.Thread | None = None

    def _observed(
        self, run: Callable[[GemmCall], dict[str, torch.Tensor]]
    ) -> Callable[[GemmCall], dict[str, torch.Tensor]]:
        """A backend's gemm calls as the runner serves them: under the harness's schedule, then into the op
        log (which so sees each call after the schedule has replaced its config)."""
        return self.override.wrap(self.oplog.wrap_backend(run))

    # --- requests -----------------------------------------------------------------------------

    def handle(self, request: Request) -> Reply:
        """The reply to one request (the runner's loop has already ended on ``exit``)."""
        match request:
            case LoadRequest():
                return self.load(request)
            case ScheduleRequest():
                return self.schedule(request)
            case DiscoverRequest():
                self._preloaded()
                return self.discover(request)
            case InputsRequest():
                return self.inputs(request)
            case DropRequest():
                return self.drop(request)
            case ResetRequest():
                return self.reset()
            case RunRequest():
                self._preloaded()
                return self.run(request)
            case FetchRequest():
                return self.fetch()
        raise ValueError(f"{request.op!r} has no reply: the runner's loop ends on it")

    def load(self, request: LoadRequest) -> Reply:
        self.device = request.device
        backend.set_backend(request.backend, wrap=self._observed)
        self.constants = dict(request.constants)
        path = self.scratch / "candidate.py"
        try:
            self.candidate = CandidateModule(path.read_text(), path)
        except Exception as exc:
            return Failed(error=f"importing the candidate failed:\n{candidate_trace(exc, path)}")
        freeze_globals(self.candidate.module)
        if self.device == "cuda":
            self._flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        self._preload = threading.Thread(target=_quietly, args=(backend.preload, request.backend),
                                         name="preload", daemon=True)
        self._preload.start()
        return Done()

    def _preloaded(self) -> None:
        """Wait for :meth:`load`'s imports: forward() never runs beside them (two threads importing one
        package can deadlock)."""
        if self._preload is not None:
            self._preload.join()
            self._preload = None

    def schedule(self, request: ScheduleRequest) -> Reply:
        """The harness's schedule for the calls that follow (``[]``: none; configs as the candidate wrote
        them)."""
        self.override.table = schedule_from_wire(request.entries)
        return Done()

    def discover(self, request: DiscoverRequest) -> Reply:
        """forward() once on meta tensors of the given shapes, its gemm calls answered with shapes only: the
        op log of a shape too large to run here (which calls, which configs). Nothing is computed or built."""
        assert self.candidate is not None, "load first"
        meta = {k: torch.empty(v.shape, dtype=DTYPES[v.dtype],
                               device="meta") for k, v in request.inputs.items()}
        self.oplog.calls.clear()
        try:
            with torch.no_grad(), backend.using("shapes", wrap=self._observed), self.oplog, self.oplog.call():
                self.candidate.forward(**meta, **self.constants)
        # the contract broken at this shape (``contract``), or forward() needs values
        except Exception as exc:
            return Failed(error=candidate_trace(exc, self.candidate.path),
                          contract=isinstance(exc, EpilogueError))
        return Discovered(ops=self.oplog.calls[:1])

    def inputs(self, request: InputsRequest) -> Reply:
        if request.window:
            if self.window is None:
                raise ProtocolError("inputs in a window, and the runner has none")
            tensors = self.window.read(request.tensors, self.device, max_bytes=self.window.size)
        else:
            path = self.scratch / Path(request.file).name
            tensors = read_tensors(path, request.tensors, self.device)
            path.unlink()
        self.sets[request.set] = tensors
        self.snapshots[request.set] = {k: v.clone() for k, v in tensors.items()}
        return Done()

    def modified(self, set_id: str) -> list[str]:
        """Inputs of a set that no longer hold what the checker sent (inputs are read-only), bit for bit: a
        -0.0 written over a 0.0 equals it (a red-team pass: state kept in the sign bits of an input's zeros),
        and a NaN never equals itself."""
        now, then = self.sets[set_id], self.snapshots[set_id]
        return [k for k in now if not same_bits(now[k], then[k])]

    def drop(self, request: DropRequest) -> Reply:
        modified = {}
        for s in request.sets:
            if s in self.sets:
                modified[s] = self.modified(s)
                del self.sets[s], self.snapshots[s]
        if self.device == "cuda":
            torch.cuda.empty_cache()
        return Dropped(modified=modified)

    def reset(self) -> Reply:
        """The next stage's peak device memory counts from here (its own, not an earlier stage's)."""
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        return Done()

    def run(self, request: RunRequest) -> Reply:
        """Run a batch of calls; keep the outputs of the ``keep`` indices for a later ``fetch``.

        Two interim messages bracket the calls (``started`` before the first, ``synced`` once the device is
        idle), so the checker's wall clock holds the calls and not the profiler's start or trace export.
        A ``dry`` batch does everything but call forward (the checker's measure of the harness's own cost).
        With ``trace`` off (timed batches the checker chose not to inspect) the kernel profiler stays off and
        the op log is not sent, but it records all the same: the host does the same work per op either way, so
        forward() cannot tell the batches apart by how fast its own host code runs.
        """
        assert self.candidate is not None and self.channel is not None, "load first"
        calls, keep, dry, traced = request.calls, set(request.keep), request.dry, request.trace
        self.batches += 1
        cuda = self.device == "cuda"
        marks: list[tuple[Any, Any]] = []
        hosts: list[float] = []
        self.oplog.calls.clear()
        trace_path = (
            self.scratch / f"trace_{self.batches}.json" if cuda and calls and traced and not dry else None
        )
        profiler = _cuda_profiler() if trace_path else nullcontext()
        with torch.no_grad(), profiler as prof, self.oplog:
            if cuda:
                torch.cuda.synchronize()
            self.channel.send(Started())
            lead_in(self.device)
            for i, set_id in enumerate(calls):
                try:
                    mark, host_s = self._one_call(i in keep, i, set_id, cuda, dry)
                    marks.append(mark)
                    hosts.append(host_s * 1e6)
                except Exception as exc:
                    self.kept.clear()
                    return Failed(call=i, error=candidate_trace(exc, self.candidate.path))
            if cuda:
                torch.cuda.synchronize()
            self.channel.send(Synced())
        if cuda:
            times = [b.elapsed_time(e) * 1e3 for b, e in marks]
        else:
            times = [(e - b) * 1e6 for b, e in marks]
        reply = Ran(times_us=times, host_us=hosts, ops=self.oplog.calls[: len(calls)] if traced else None)
        if trace_path is not None and prof is not None:
            prof.export_chrome_trace(str(trace_path))
            reply.trace = trace_path.name
        return reply

    def _one_call(self, kept: bool, index: int, set_id: str, cuda: bool,
                  dry: bool = False) -> tuple[tuple[Any, Any], float]:
        """One call: its start and end marks (CUDA events, or host times on the CPU), and the host seconds
        forward() took (with its events on the CUDA side: how long the GPU may have waited for its
        launches)."""
        assert self.candidate is not None
        inputs = {} if dry else self.sets[set_id]
        forward = (lambda **_: None) if dry else self.candidate.forward
        if cuda:
            torch.cuda._sleep(1)  # the marker kernel: the trace splits into calls here
            assert self._flush is not None
            with torch._C._DisableTorchDispatch():  # the harness's own op: no round trip through the op log
                self._flush.zero_()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with self.oplog.call():
                t0 = time.perf_counter()
                begin.record()
                out = forward(**inputs, **self.constants)
                end.record()
                host_s = time.perf_counter() - t0
            mark: tuple[Any, Any] = (begin, end)
        else:
            with self.oplog.call():
                t0 = time.perf_counter()
                out = forward(**inputs, **self.constants)
                mark = (t0, time.perf_counter())
            host_s = mark[1] - mark[0]
        if kept and not dry:
            self.kept.append((index, out, set_id))
        return mark, host_s

    def fetch(self) -> Reply:
        """Write the kept outputs to a tensor file; describe what is not a dict of plain tensors."""
        described, tensors = [], {}
        for index, out, set_id in self.kept:
            entry = CallReport(call=index, kind=type(out).__name__, inputs_modified=self.modified(set_id))
            if isinstance(out, dict):
                for key, value in out.items():
                    name = str(key)
                    if type(value) is not torch.Tensor:
                        entry.bad[name] = type(value).__name__
                        continue
                    tensors[f"{index}/{name}"] = value
                    entry.storages[name] = value.untyped_storage().data_ptr() if value.numel() else 0
                entry.keys = [str(k) for k in out]
            described.append(entry)
        refs = self.window.write(tensors) if self.window is not None else None
        if refs is not None:
            self.kept.clear()
            return Fetched(file="", tensors=refs, calls=described, window=True)
        path = self.scratch / f"out_{self.batches}.bin"
        refs = write_tensors(path, tensors)
        self.kept.clear()
        return Fetched(file=path.name, tensors=refs, calls=described)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same shape, dtype and bytes."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _cuda_profiler() -> Any:
    """The kernel profiler of a traced batch. Kineto leaves CUPTI attached when it stops, unless the checker's
    environment sets ``TEARDOWN_CUPTI=1`` (passed through, ``sandbox.PASS_ENV``). Attached, the untraced
    batches after it spent more host time per forward() in 8 of 8 measurements on the H200 (+2% to +113%,
    bench/results/h200-2026-12-02-d-notes.md); finalizing it lost whole traces there while five checks shared
    the GPU (h200-2026-12-02-notes.md). So it stays attached by default, and the bench can be run with it
    set."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CUDA])


def _quietly(fn: Callable[[str], None], arg: str) -> None:
    """``fn(arg)``, a failure left for the call that needs it to meet again, in the main thread."""
    with contextlib.suppress(Exception):
        fn(arg)


def serve(channel: Channel, runner: Runner) -> None:
    """Answer the checker's requests until it sends ``exit`` or goes away. A request that is unknown or
    malformed is the harness's fault, answered as one (``harness``), like any failure of the runner's own
    code."""
    runner.channel = channel
    while True:
        try:
            message = channel.recv()
        except ProtocolError:
            return
        try:
            request = parse_request(message)
        except ProtocolError as exc:
            channel.send(Failed(harness=True, error=str(exc)))
            continue
        if isinstance(request, ExitRequest):
            return
        try:
            reply = runner.handle(request)
        except Exception:
            reply = Failed(harness=True, error=traceback.format_exc(limit=4)[-2000:])
        # this process's peak so far (PyTorch's count)
        if runner.device == "cuda" and torch.cuda.is_initialized():
            reply.peak_bytes = int(torch.cuda.max_memory_allocated())
        channel.send(reply)


def main() -> NoReturn:
    # The protocol keeps private copies of stdin/stdout; the candidate's prints go to stderr.
    channel = Channel.from_fds(os.dup(0), os.dup(1))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    fd = os.environ.get(WINDOW_FD_ENV)
    serve(channel, Runner(Path.cwd(), Window.attach(int(fd)) if fd else None))
    # No interpreter teardown: CUDA's, the DSL's and the candidate's exit hooks took 2 s on the H200 while the
    # checker waited for this exit (h200-2026-12-05-b-notes.md); the process's end releases all of it anyway.
    sys.stderr.flush()
    os._exit(0)
