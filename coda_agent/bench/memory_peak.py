"""What is alive at a step's memory peak, and where it was allocated: the caching allocator's trace of one
step (``torch.cuda.memory._record_memory_history``), replayed.

A peak is a number; to lower it one needs the tensors behind it. The replay counts each block from its
``alloc`` to its ``free_requested`` (when ``torch.cuda.max_memory_allocated`` stops counting it), finds the
moment the step's own allocations peak, and sums the blocks alive then by the line that made them: the
innermost frame in the model's code (``coda_agent/torch``, past the ops' wrapper), else in coda_agent, else
outside torch and the standard library. Blocks of autograd's C++ backward carry no Python frame and are
counted as such.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from .results import PeakBreakdown, PeakShare

#: The places a breakdown names, largest first; the rest are summed as one.
PEAK_SHARES = 12
#: Allocator events kept while a step is recorded: enough for a 16-layer step's, bounded.
MAX_EVENTS = 1_000_000
NO_FRAME = "(no Python frame: autograd's C++ backward, or a compiled graph's own allocation)"
_TORCH = os.path.dirname(torch.__file__)
_STDLIB = sysconfig.get_paths()["stdlib"]
_PREFERRED = (f"{os.sep}coda_agent{os.sep}torch{os.sep}", f"{os.sep}coda_agent{os.sep}")
#: The ops' own wrapper: every task kernel's outputs pass through it; the line that called the op names them.
_WRAPPERS = (f"{os.sep}coda_agent{os.sep}torch{os.sep}ops.py",)


def _where(frames: Sequence[Mapping[str, Any]]) -> str:
    """The line a block is charged to (module docstring), as ``path:line (function)`` from coda_agent on."""

    def label(f: Mapping[str, Any]) -> str:
        name = str(f.get("filename", "?"))
        cut = name.rfind(f"{os.sep}coda_agent{os.sep}")
        return f"{name[cut + 1:] if cut >= 0 else name}:{f.get('line', '?')} ({f.get('name', '?')})"

    frames = [f for f in frames if not str(f.get("filename", "")).endswith(_WRAPPERS)]
    for marker in _PREFERRED:
        found = next((f for f in frames if marker in str(f.get("filename", ""))), None)
        if found is not None:
            return label(found)
    own = next((f for f in frames if not str(f.get("filename", "")).startswith((_TORCH, _STDLIB, "<"))), None)
    return label(own) if own is not None else NO_FRAME


def peak_live(events: Iterable[Mapping[str, Any]], shares: int = PEAK_SHARES) -> PeakBreakdown:
    """The allocator trace ``events`` (oldest first) replayed: the most bytes its allocations held at once,
    and those blocks summed by :func:`_where`, the ``shares`` largest by name and the rest as one."""
    live: dict[int, tuple[int, str]] = {}
    held = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for e in events:
        action = e.get("action")
        if action == "alloc":
            live[int(e["addr"])] = (int(e["size"]), _where(e.get("frames") or ()))
            held += int(e["size"])
            if held > peak:
                peak, at_peak = held, dict(live)
        elif action == "free_requested":
            size, _ = live.pop(int(e["addr"]), (0, ""))  # a block allocated before the recording: not counted
            held -= size
    sums: dict[str, PeakShare] = {}
    for size, where in at_peak.values():
        got = sums.get(where, PeakShare(where=where, bytes=0, blocks=0))
        sums[where] = PeakShare(where=where, bytes=got.bytes + size, blocks=got.blocks + 1)
    ranked = sorted(sums.values(), key=lambda s: -s.bytes)
    rest = ranked[shares:]
    if rest:
        others = PeakShare(where=f"{len(rest)} other places", bytes=sum(s.bytes for s in rest),
                           blocks=sum(s.blocks for s in rest))
        ranked = [*ranked[:shares], others]
    return PeakBreakdown(step_bytes=peak, shares=ranked)


def record_peak(step: Callable[[], object]) -> PeakBreakdown:
    """One ``step`` on the GPU with the allocator's trace recorded (Python frames only), replayed."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=MAX_EVENTS)
    try:
        step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    traces = snapshot.get("device_traces") or [[]]
    return peak_live(traces[torch.cuda.current_device()] if len(traces) > 1 else traces[0])
