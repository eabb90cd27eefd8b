"""The wire between the trusted checker and the sandboxed runner: JSON lines plus raw tensor files (or, on a
GPU host, the shared memory window of :mod:`.window`).

Nothing on this wire is ever unpickled or executed: messages are JSON objects (one per line, bounded in
size), tensors are raw bytes in a file of the runner's scratch folder, described by a :class:`TensorRef`
the reader validates (known dtype, sane shape, inside the file, within the reader's byte limit) before viewing
the bytes. The scratch folder is writable by both sides, so every file in it is opened by its bare name, never
through a link, and read only if it is a regular file: a runner that plants a symlink, a FIFO or a device
there gets a :class:`ProtocolError`, not the checker's hand on another file. So whatever the runner sends, the
worst it can do is send wrong numbers, which the checker is there to catch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Annotated, Any, Literal, TypeVar, get_args

import torch
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

#: A message larger than this is refused (a runner cannot make the checker buffer without bound).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}


#: The most device memory a runner may report as its peak (``peak_bytes`` in a reply): 1 PiB, past any GPU.
MAX_REPORTED_BYTES = 1 << 50


def reported_bytes(value: object) -> int | None:
    """A byte count the runner reported (its replies' ``peak_bytes``), or None for anything but a whole number
    in [0, :data:`MAX_REPORTED_BYTES`]: a diagnostic from the untrusted side, shown and never acted on."""
    return value if type(value) is int and 0 <= value <= MAX_REPORTED_BYTES else None


class ProtocolError(Exception):
    """The other side sent something malformed, or went away."""


class Message(BaseModel):
    """Anything on the wire: exactly its fields, each of its own type (strict: ``"1"`` is no 1), nothing
    else."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TensorRef(Message):
    """Where one tensor's bytes lie in a tensor file."""

    name: str
    dtype: str
    shape: list[int]
    offset: int = Field(ge=0)
    nbytes: int = Field(ge=0)


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _check_name(path: Path) -> None:
    if path.name in ("", ".", ".."):
        raise ProtocolError(f"{str(path)!r} does not name a file")


def create_file(path: Path) -> int:
    """A new regular file at ``path`` for writing (whatever the other side left there is removed first, never
    followed); returns its descriptor."""
    _check_name(path)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ProtocolError(f"cannot create {path.name}: {exc.strerror}") from None


def open_regular(path: Path, max_bytes: int) -> tuple[int, int]:
    """``(fd, size)`` of the regular file at ``path``, opened without following a link or blocking on a FIFO;
    ProtocolError for anything else or for a file over ``max_bytes``."""
    _check_name(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ProtocolError(f"cannot open {path.name}: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(info.st_mode) else (f"{info.st_size} bytes, over "
                                                                            f"{max_bytes}")
        raise ProtocolError(f"{path.name} is {what}")
    return fd, info.st_size


def read_text(path: Path, max_bytes: int) -> str:
    """The text of a regular file of at most ``max_bytes`` (undecodable bytes replaced)."""
    fd, size = open_regular(path, max_bytes)
    with os.fdopen(fd, "rb") as f:
        return f.read(size).decode(errors="replace")


def _host_buffer(nbytes: int, pinned: bool) -> torch.Tensor:
    """Uninitialised host bytes; page-locked where a GPU copy will touch them. Torch's host allocator caches
    page-locked blocks, so the repeated transfers of a timing run reuse memory that is already mapped and copy
    by DMA; a fresh pageable buffer costs a page fault per 4 KiB and a staged copy (bench/README.md, ninth
    session)."""
    if pinned:
        with contextlib.suppress(RuntimeError):  # no pinnable memory left: the pageable path still works
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return torch.empty(nbytes, dtype=torch.uint8)


def write_tensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> list[TensorRef]:
    """Write each tensor's bytes (contiguous, through one host buffer per tensor) one after another; returns
    their refs."""
    refs, offset = [], 0
    with os.fdopen(create_file(path), "wb") as f:
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            if t.device.type == "cpu":
                data = (
                    t.detach().contiguous().reshape(-1).view(torch.uint8)
                    if nbytes
                    else torch.empty(0, dtype=torch.uint8)
                )
            else:
                data = _host_buffer(nbytes, pinned=t.is_cuda)
                if nbytes:
                    data.view(t.dtype).view(t.shape).copy_(t.detach())
            f.write(data.numpy().data)  # a view, no copy of its own: outputs run to GBs at the LM-head shapes
            refs.append(TensorRef(name=name, dtype=dtype_name(t.dtype), shape=list(t.shape), offset=offset,
                                  nbytes=nbytes))
            offset += nbytes
    return refs


def checked_dtype(ref: TensorRef, size: int, where: str, aligned: bool = False) -> torch.dtype:
    """``ref``'s dtype, once the ref is known sound: a known dtype, a sane shape, its bytes those of its shape
    and inside the ``size`` bytes of ``where`` (and, ``aligned``, at an offset its element size divides);
    ProtocolError otherwise."""
    dt = DTYPES.get(ref.dtype)
    if dt is None:
        raise ProtocolError(f"tensor {ref.name!r} has an unknown dtype {ref.dtype!r}")
    if any(d < 0 for d in ref.shape) or len(ref.shape) > 8:
        raise ProtocolError(f"tensor {ref.name!r} has an invalid shape {ref.shape}")
    itemsize = torch.empty(0, dtype=dt).element_size()
    if (ref.nbytes != math.prod(ref.shape) * itemsize or ref.offset + ref.nbytes > size
            or (aligned and ref.offset % itemsize)):
        raise ProtocolError(f"tensor {ref.name!r} does not fit {where} ({ref.nbytes} bytes at {ref.offset}, "
                            f"{where.removeprefix('its ').removeprefix('the ')} {size})")
    return dt


def read_tensors(path: Path, refs: list[TensorRef], device: str = "cpu",
                 max_bytes: int = 1 << 40) -> dict[str, torch.Tensor]:
    """The tensors ``refs`` describe, validated against the file and ``max_bytes`` (the file's size and the
    refs' total) before any byte is interpreted."""
    if sum(ref.nbytes for ref in refs) > max_bytes:
        raise ProtocolError(f"the tensors of {path.name} add up to more than the {max_bytes} bytes expected")
    fd, size = open_regular(path, max_bytes)
    blob = _host_buffer(size, pinned=torch.device(device).type == "cuda")
    with os.fdopen(fd, "rb") as f:  # read, not mapped: the other side may shrink the file while it is read
        if size and f.readinto(blob.numpy().data) != size:
            raise ProtocolError(f"{path.name} changed while it was read")
    out: dict[str, torch.Tensor] = {}
    for ref in refs:
        dt = checked_dtype(ref, size, "its file")
        if not ref.nbytes:
            out[ref.name] = torch.empty(ref.shape, dtype=dt, device=device)
            continue
        raw = blob[ref.offset : ref.offset + ref.nbytes]
        if device == "cpu" or ref.offset % dt.itemsize:  # its own memory (the copy to a GPU is one already)
            raw = raw.clone()
        out[ref.name] = raw.view(dt).reshape(ref.shape).to(device)
    return out


# --- the messages ---------------------------------------------------------------------------------------
# Requests go from the checker to the runner, named by ``op``; the runner validates each in parse_request.
# Replies carry ``ok``: a Failed one, or the kind of reply its request expects, which the checker validates in
# parse_reply.


class MetaTensor(Message):
    """An input's shape and dtype, without its values (a ``discover`` request)."""

    shape: list[int]
    dtype: str

    @field_validator("dtype")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in DTYPES:
            raise ValueError(f"unknown dtype {value[:40]!r}")
        return value


class LoadRequest(Message):
    """Import the candidate (``candidate.py`` in the scratch folder) on this backend and device."""

    op: Literal["load"] = "load"
    backend: str
    device: str = "cpu"
    constants: dict[str, Any] = {}


class ScheduleRequest(Message):
    """The harness's schedule for the calls that follow (``primitives.configs.schedule_to_wire``)."""

    op: Literal["schedule"] = "schedule"
    entries: list[list[Any]] = []


class DiscoverRequest(Message):
    """forward() once on meta tensors: its op log at a shape too large to run."""

    op: Literal["discover"] = "discover"
    inputs: dict[str, MetaTensor]


class InputsRequest(Message):
    """One input set, in a tensor file of the scratch folder, or (``window``) in the shared window."""

    op: Literal["inputs"] = "inputs"
    set: str
    file: str
    tensors: list[TensorRef]
    window: bool = False


class DropRequest(Message):
    """Forget these input sets."""

    op: Literal["drop"] = "drop"
    sets: list[str] = []


class ResetRequest(Message):
    """Another stage of the same verification begins in this runner: the device memory its allocator caches
    goes back, and its peak counts afresh."""

    op: Literal["reset"] = "reset"


class RunRequest(Message):
    """A batch of calls, one per input set named; the outputs of the ``keep`` indices are kept for a fetch."""

    op: Literal["run"] = "run"
    calls: list[str]
    keep: list[int] = []
    dry: bool = False
    trace: bool = True


class FetchRequest(Message):
    """The kept outputs, in a tensor file."""

    op: Literal["fetch"] = "fetch"


class ExitRequest(Message):
    """End the runner."""

    op: Literal["exit"] = "exit"


Request = Annotated[
    LoadRequest | ScheduleRequest | DiscoverRequest | InputsRequest | DropRequest | ResetRequest | RunRequest
    | FetchRequest | ExitRequest,
    Field(discriminator="op"),
]
_REQUESTS: TypeAdapter[Request] = TypeAdapter(Request)
_REQUEST_OPS = frozenset(kind.model_fields["op"].default for kind in get_args(get_args(Request)[0]))

#: What one call ran: its aten ops and gemm calls, as ``serve.OpLog`` records them.
CallOps = list[dict[str, Any]]


class Reply(Message):
    """What every reply carries: ``ok``, and the runner's peak device memory so far (a diagnostic: anything
    but a plausible byte count reads as none, :func:`reported_bytes`)."""

    ok: bool
    peak_bytes: Annotated[int | None, BeforeValidator(reported_bytes)] = None


class Failed(Reply):
    """The request failed: the candidate raised (``call``: in which call of a batch; ``contract``: it misused
    the primitives), or the harness did (``harness``)."""

    ok: Literal[False] = False
    error: str
    harness: bool = False
    call: int | None = None
    contract: bool = False


class Done(Reply):
    """A ``load``, ``schedule`` or ``inputs`` request was carried out."""

    ok: Literal[True] = True


class Discovered(Reply):
    """What the one call on meta tensors ran."""

    ok: Literal[True] = True
    ops: list[CallOps] = Field(max_length=1)


class Dropped(Reply):
    """Per set dropped, the inputs forward() modified while it was held."""

    ok: Literal[True] = True
    modified: dict[str, list[str]]


class Started(Reply):
    """A batch's first call is about to run (the checker's wall clock starts)."""

    ok: Literal[True] = True
    started: Literal[True] = True


class Synced(Reply):
    """A batch's calls are done and the device is idle (the checker's wall clock stops)."""

    ok: Literal[True] = True
    synced: Literal[True] = True


def _diagnostic_times(value: object) -> object:
    """Host times the runner reported: anything but a list of finite, non-negative numbers reads as none."""
    if isinstance(value, list) and all(type(v) in (int, float) and 0 <= v < math.inf for v in value):
        return [float(v) for v in value]
    return []


class Ran(Reply):
    """A batch's times (µs, one per call), the host time forward() took in each, its kernel trace (a file of
    the scratch folder, traced GPU batches only) and its op log (traced batches only)."""

    ok: Literal[True] = True
    times_us: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]]
    host_us: Annotated[list[float], BeforeValidator(_diagnostic_times)] = []
    trace: str | None = None
    ops: list[CallOps] | None = None


class CallReport(Message):
    """One kept output: its type, and, for a dict, its keys, the values that are no plain tensor (``bad``:
    their type names) and each tensor's storage address (aliasing); and the inputs the call modified."""

    call: int
    kind: str
    bad: dict[str, str] = {}
    storages: dict[str, int] = {}
    keys: list[str] = []
    inputs_modified: list[str] = []


class Fetched(Reply):
    """The kept outputs: their tensors in ``file``, or (``window``) in the shared window (keys
    ``"<call>/<name>"``), and what each call returned."""

    ok: Literal[True] = True
    file: str
    tensors: list[TensorRef]
    calls: list[CallReport]
    window: bool = False


def parse_request(message: dict[str, Any]) -> Request:
    """The request ``message`` is; ProtocolError for an unknown or malformed one."""
    op = message.get("op")
    if op not in _REQUEST_OPS:
        raise ProtocolError(f"unknown request {_clipped(op)}")
    try:
        return _REQUESTS.validate_python(message)
    except ValidationError as exc:
        raise ProtocolError(f"malformed {op!r} request: {_problems(exc)}") from None


ExpectedReply = TypeVar("ExpectedReply", bound=Reply)


def parse_reply(message: dict[str, Any], expected: type[ExpectedReply]) -> ExpectedReply | Failed:
    """The reply ``message`` is: Failed (``ok`` false) or the ``expected`` kind (``ok`` true); ProtocolError
    for anything else (no ``ok``, a missing, mistyped or unknown field), its text bounded whatever the runner
    sent."""
    ok = message.get("ok")
    model: type[ExpectedReply | Failed] | None = expected if ok is True else Failed if ok is False else None
    if model is None:
        raise ProtocolError(f"a reply's 'ok' must be true or false, not {_clipped(ok)}")
    try:
        return model.model_validate(message)
    except ValidationError as exc:
        raise ProtocolError(f"not a {model.__name__} reply: {_problems(exc)}") from None


def _clipped(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _problems(exc: ValidationError, most: int = 3) -> str:
    """The first few problems, each as ``field.path: what is wrong`` (no input values: they may be huge)."""
    errors = exc.errors(include_url=False, include_input=False)
    lines = [".".join(_clipped(p, 40) if isinstance(p, str) and len(p) > 40 else str(p) for p in e["loc"])
             + f": {e['msg']}"
             for e in errors[:most]]
    more = f" (and {len(errors) - most} more)" if len(errors) > most else ""
    return "; ".join(lines)[:600] + more


class Channel:
    """One JSON object per line in each direction, over a pair of file descriptors."""

    def __init__(self, reader: IO[bytes], writer: IO[bytes]) -> None:
        self._reader, self._writer = reader, writer

    @classmethod
    def from_fds(cls, read_fd: int, write_fd: int) -> Channel:
        return cls(os.fdopen(read_fd, "rb"), os.fdopen(write_fd, "wb"))

    def send(self, message: Message) -> None:
        data = json.dumps(message.model_dump(exclude_none=True), separators=(",", ":")).encode() + b"\n"
        try:
            self._writer.write(data)
            self._writer.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ProtocolError(f"the other side closed the channel ({exc})") from None

    def recv(self) -> dict[str, Any]:
        line = self._reader.readline(MAX_MESSAGE_BYTES + 1)
        if not line:
            raise ProtocolError("the other side closed the channel")
        if len(line) > MAX_MESSAGE_BYTES or not line.endswith(b"\n"):
            raise ProtocolError("a message was larger than the protocol allows")
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            raise ProtocolError("a message was not valid JSON (or nested too deep)") from None
        if not isinstance(message, dict):
            raise ProtocolError("a message was not a JSON object")
        return message

    def close(self) -> None:
        for f in (self._reader, self._writer):
            with contextlib.suppress(OSError):
                f.close()
