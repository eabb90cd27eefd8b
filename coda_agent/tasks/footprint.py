"""A reference's working memory: the most one call holds beyond what it returns, measured, then scaled to any
shape.

The device-memory estimate (``verifier.plan``) cannot read it from the task's tensor sizes: a cross-entropy
that returns only per-row losses builds M x V logits, and a logsumexp temporary as large, on the way. So the
reference runs on the CPU under the profiler at the first small shape, and again with each shape symbol
doubled; every allocation of the call (those inside ATen ops too, which a dispatch mode would not see) grows
with each symbol as it did there, and the call's allocations and frees are replayed at the target shape's
sizes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .loader import TaskError, reference_function, upcast
from .model import Task

#: An allocation is ("alloc", bytes) or ("free", index of the allocation it releases), in the call's order.
Event = tuple[str, int]


@dataclass(frozen=True)
class CallProfile:
    """One reference call's allocations at ``base`` dims, and each one's growth exponent per shape symbol."""

    base: Mapping[str, int]
    events: tuple[Event, ...]
    growth: tuple[Mapping[str, float], ...]  # per allocation event, in order

    def working_bytes(self, dims: Mapping[str, int]) -> int:
        """The call's peak live bytes beyond those it still holds at its end (its outputs), at ``dims``."""
        allocs = [n for kind, n in self.events if kind == "alloc"]
        sizes = [
            n * math.prod((dims[s] / self.base[s]) ** e for s, e in g.items())
            for n, g in zip(allocs, self.growth, strict=True)
        ]
        peak, end = _replay(self.events, sizes)
        return max(0, math.ceil(peak - end))


def reference_working_bytes(task: Task, dims: Mapping[str, int]) -> int:
    """The most a reference call holds beyond its outputs at ``dims``: the larger of the FP32 call (inputs
    upcast, the truth) and the task-dtype one (the eager yardstick). Measured once per task and reference file
    version in a process (a few tenths of a second)."""
    key = (task.model_dump_json(), str(task.reference_file), task.reference_file.stat().st_mtime_ns)
    if key not in _MEASURED:
        _MEASURED[key] = (_call_profile(task, fp32=True), _call_profile(task, fp32=False))
    return max(p.working_bytes(dims) for p in _MEASURED[key])


#: The profiles measured in this process, by task, reference file and its modification time.
_MEASURED: dict[tuple[str, str, int], tuple[CallProfile, CallProfile]] = {}


def _call_profile(task: Task, fp32: bool) -> CallProfile:
    base = task.shape("small")[0].dims
    events = _allocations(task, base, fp32)
    allocs = [n for kind, n in events if kind == "alloc"]
    growth: list[dict[str, float]] = [{} for _ in allocs]
    for symbol in base:
        doubled = _allocations(task, {**base, symbol: 2 * base[symbol]}, fp32)
        pairs: list[tuple[float, float]]
        if [k for k, _ in doubled] == [k for k, _ in events]:
            pairs = list(zip(allocs, [n for kind, n in doubled if kind == "alloc"], strict=True))
        else:  # the call took another path at this size: every allocation grows as its peak did
            pairs = [(_peak(events), _peak(doubled))] * len(allocs)
        for g, (was, now) in zip(growth, pairs, strict=True):
            g[symbol] = _exponent(was, now)
    return CallProfile(base, tuple(events), tuple(growth))


def _exponent(was: float, now: float) -> float:
    """How a size grew when one symbol doubled, as a power of that symbol (snapped to a whole one when within
    0.05: (M x V + M) grows with V as V does, and the estimate errs high)."""
    if was <= 0 or now <= 0:
        return 0.0
    e = math.log2(now / was)
    return float(round(e)) if abs(e - round(e)) < 0.05 else e


def _replay(events: list[Event] | tuple[Event, ...], sizes: list[float]) -> tuple[float, float]:
    """The peak and the final live bytes of a call's events with its allocations at ``sizes``."""
    live = peak = 0.0
    allocated = 0
    for kind, value in events:
        if kind == "alloc":
            live += sizes[allocated]
            allocated += 1
            peak = max(peak, live)
        else:
            live -= sizes[value]
    return peak, live


def _peak(events: list[Event]) -> float:
    return _replay(events, [n for kind, n in events if kind == "alloc"])[0]


def _allocations(task: Task, dims: Mapping[str, int], fp32: bool) -> list[Event]:
    """The CPU allocations and frees of one reference call at ``dims``, in order (the inputs' own are not in
    it)."""
    import torch
    import torch._C._profiler as profiler_types
    from torch.profiler import ProfilerActivity, profile

    # else kineto writes its start and stop lines on our stderr
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    inputs = task.make_inputs(dict(dims), seed=0)
    if fp32:
        inputs = upcast(inputs)
    fn = reference_function(task)
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn(**inputs, **task.constants)
    except Exception as exc:  # a reference's own failure, said in one line
        raise TaskError(f"{task.path}: the reference raised {type(exc).__name__} at {dict(dims)} while its "
                        f"memory was measured: {exc}") from None
    del out  # only now: the outputs are what the call still holds at the end of its timeline
    found: list[tuple[int, int, int]] = []  # (time, size, address)
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        extra = node.extra_fields
        if isinstance(extra, profiler_types._ExtraFields_Allocation) and extra.device.type == "cpu":
            found.append((node.start_time_ns, extra.alloc_size, extra.ptr))
        stack.extend(node.children)
    events: list[Event] = []
    open_at: dict[int, int] = {}  # address -> index of its allocation among the allocations
    allocated = 0
    for _, size, ptr in sorted(found, key=lambda f: f[0]):
        if size > 0:
            open_at[ptr] = allocated
            events.append(("alloc", size))
            allocated += 1
        elif ptr in open_at:  # a free of what the call allocated (not of an input's)
            events.append(("free", open_at.pop(ptr)))
    return events
