"""The one rule for which candidate is best, used by the agent loop, the prompts and the index.

Correct beats incorrect; among correct candidates a timed one beats an untimed one, and the lower
geometric mean of its per-shape median times wins (within one run every candidate is timed at the same
shapes, so this orders them exactly as the geomean of any per-shape speedup would); among untimed ones, the
nearer the speed of light by the CPU's cost estimate (the sm_90a build's); ties go to the earlier attempt.
The population the model is shown is the best *distinct* correct candidates by the same rule.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..verifier.verdict import Verdict
from .records import Attempt
from .timings import timing_points


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive finite values; None when there is none."""
    good = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else None


def shape_ratio(shape: Mapping[str, Any], key: str) -> float | None:
    """One shape of an ``Attempt.timing`` record, by a ratio key: ``speedup_vs_human`` / ``_cublas`` /
    ``_compiled`` / ``_eager`` (that time / the candidate's, > 1 is faster; a baseline's paired ratio where
    the record keeps it) or ``sol_fraction``; None when a number is missing."""
    paired = (shape.get("speedups") or {}).get(key.removeprefix("speedup_vs_"))
    if paired:
        return float(paired)
    if key == "speedup_vs_human":
        other = shape.get("human_us")
    elif key == "sol_fraction":
        other = shape.get("sol_us")
    else:
        other = (shape.get("baselines") or {}).get(key.removeprefix("speedup_vs_"))
    us = shape.get("median_us")
    return float(other) / float(us) if other and us else None


def attempt_time_us(attempt: Attempt) -> float | None:
    """Geometric mean of an attempt's median times over its timed shapes (µs, in any recorded form); None when
    untimed."""
    return geomean(p.median_us for p in timing_points(attempt.timing).values())


#: A run target's key for a fraction of the speed of light by the CPU's cost estimate (a run without GPU
#: timing: :func:`estimate_sol_fraction` of its best candidate).
ESTIMATE_GOAL = "estimate_sol_fraction"


def estimate_sol_fraction(attempt: Attempt) -> float | None:
    """The speed of light over the CPU's cost estimate, geometric mean over the bench shapes (the sm_90a
    build's ``cost`` details, ``verifier.cost``); None where the build priced none."""
    return verdict_estimate_fraction(attempt.verdict)


def verdict_estimate_fraction(verdict: Verdict | None) -> float | None:
    """:func:`estimate_sol_fraction` of one verdict."""
    for stage in verdict.stages if verdict is not None else []:
        costs = stage.details.get("cost") if stage.stage == "compile" else None
        if isinstance(costs, list):
            return geomean(float(c["sol_us"]) / float(c["total_us"]) for c in costs if isinstance(c, dict)
                           and _positive(c.get("sol_us")) and _positive(c.get("total_us")))
    return None


def _positive(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and math.isfinite(v)


def speed_key(attempt: Attempt) -> tuple[bool, bool, float, float, int]:
    """Sort key, best first: passed, timed, faster; untimed, nearer the speed of light by the CPU's estimate;
    earlier."""
    us = attempt_time_us(attempt) if attempt.passed else None
    estimate = -(estimate_sol_fraction(attempt) or 0.0) if attempt.passed and us is None else 0.0
    return (not attempt.passed, us is None, us if us is not None else 0.0, estimate, attempt.index)


def best_attempt(attempts: Iterable[Attempt]) -> Attempt | None:
    """The best correct attempt, or None when none passed."""
    passed = [a for a in attempts if a.passed]
    return min(passed, key=speed_key, default=None)


def code_fingerprint(code: str) -> str:
    """Two candidates are the same when their code parses to the same tree (comments and layout do not
    count)."""
    try:
        return ast.dump(ast.parse(code))
    # any text: NUL bytes, nesting Python gives up on
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return " ".join(code.split())


def population(attempts: Sequence[Attempt], size: int) -> list[Attempt]:
    """The ``size`` best distinct correct attempts, best first (a resubmitted candidate counts once, at its
    best time)."""
    seen: set[str] = set()
    out: list[Attempt] = []
    for a in sorted((a for a in attempts if a.passed and a.code is not None), key=speed_key):
        fp = code_fingerprint(a.code or "")
        if fp in seen:
            continue
        seen.add(fp)
        out.append(a)
        if len(out) == size:
            break
    return out
