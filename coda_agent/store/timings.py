"""An attempt's recorded timing, read in every form it has been written: per shape, the candidate's median
time and what the same session measured next to it (human kernel, baselines, speed of light).

The agent writes ``Attempt.timing`` as described in ``coda_agent/agent/timing.py``; older records and bench
rows use other shapes of the same figures. :func:`timing_points` is the one reader, so the ranking, the index,
``show`` and the viewer agree on what an attempt's times are, and a form it does not know yields nothing,
never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def positive(x: Any) -> float | None:
    """``x`` as a float when it is a positive finite number (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) and x > 0 else None


def _us(value: Any) -> float | None:
    """Microseconds from a number or a bench ``Timing``-like mapping (``median_us``)."""
    return positive(value.get("median_us")) if isinstance(value, Mapping) else positive(value)


@dataclass(frozen=True)
class TimingPoint:
    """A candidate's median time at one shape, with what the same session measured next to it."""

    median_us: float
    human_us: float | None = None
    sol_us: float | None = None
    eager_us: float | None = None
    compiled_us: float | None = None
    cublas_us: float | None = None


def _timing_point(entry: Any) -> TimingPoint | None:
    if not isinstance(entry, Mapping):
        v = positive(entry)
        return TimingPoint(v) if v is not None else None
    median = _us(entry["candidate"]) if "candidate" in entry else _us(entry.get("median_us"))
    if median is None:
        return None
    nested = entry.get("baselines")
    base: Mapping[str, Any] = nested if isinstance(nested, Mapping) else entry

    def pick(name: str) -> float | None:
        return _us(base.get(name, base.get(f"{name}_us")))

    return TimingPoint(
        median, human_us=_us(entry.get("human_us", entry.get("human"))), sol_us=_us(entry.get("sol_us")),
        eager_us=pick("eager"), compiled_us=pick("compiled"), cublas_us=pick("cublas"),
    )


def timing_points(timing: Mapping[str, Any]) -> dict[str | None, TimingPoint]:
    """Per shape (None: shape not named), the candidate's time from an attempt's ``timing`` dict.

    Understood forms: the agent's ``{shapes: {name: {median_us, human_us?, sol_us?, baselines?}}}``
    (see ``coda_agent/agent/timing.py``); ``{shapes|rows: [{shape, ...}]}``; a bench row
    ``{candidate: {median_us}, eager: {median_us}, ..., shape?}``; ``{median_us, shape?}``.
    Anything else (or a non-positive number) yields nothing rather than a guess.
    """
    if not isinstance(timing, Mapping) or not timing:
        return {}
    single = _timing_point(timing) if ("median_us" in timing or "candidate" in timing) else None
    if single is not None:
        shape = timing.get("shape")
        return {str(shape) if shape else None: single}
    for key in ("shapes", "rows"):
        nested = timing.get(key)
        if isinstance(nested, Mapping):
            return {str(k): v for k, e in nested.items() if (v := _timing_point(e)) is not None}
        if isinstance(nested, list):
            out: dict[str | None, TimingPoint] = {}
            for e in nested:
                if isinstance(e, Mapping) and (v := _timing_point(e)) is not None:
                    out[str(e["shape"]) if e.get("shape") else None] = v
            return out
    return {}
