"""GPU timings the agent reasons with, read from a verdict.

Timings come from the verifier's ``profile`` stage (GPU only). The speed of light beside them
(``measure.peaks``) uses the peaks the agent measured on its GPU, or on a CPU-only run the H200's
nominal ones; the prompt names which.

``Attempt.timing`` (see ``store/records.py``) holds what :func:`timing_from_verdict` returns::

    {"shapes": {"<shape>": {"median_us": 812.3, "human_us": 790.1, "sol_us": 480.2, "bound": "compute",
                            # or, where forward() kept the GPU waiting: "host_us": 700.0, "bound": "host"
                            "baselines": {"eager": 1500.0, "compiled": 1100.0, "cublas": 700.0},
                            "speedups": {"eager": 1.85, "compiled": 1.35, "cublas": 0.86}}},
     "geomean_us": 812.3, "speedup_vs_human": 0.97, "speedup_vs_cublas": 0.86, "speedup_vs_compiled": 1.35,
     "sol_fraction": 0.59}

Ratios (other time / candidate time, > 1 is faster) are geometric means over the shapes that have both
numbers; a ratio that cannot be formed is absent. A shape's ``speedups`` against the baselines timed with it
pair the interleaved rounds (:func:`~coda_agent.measure.timing.paired_ratio`, as the bench's ratios do); the
human kernel, timed in another session, compares by its median. The ``speedup_vs_*`` keys are what a run's
target names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..measure.baselines import BASELINES
from ..measure.peaks import SolPoint
from ..measure.timing import paired_ratio
from ..store.ranking import geomean, shape_ratio
from ..verifier.verdict import Verdict


def timing_from_verdict(
    verdict: Verdict | None, human: Mapping[str, float] | None = None,
    sol: Mapping[str, SolPoint] | None = None
) -> dict[str, Any]:
    """The ``Attempt.timing`` record of a profiled verdict; ``{}`` when it was not timed.

    ``human`` (shape -> µs of the human kernel in this session) and ``sol`` (shape -> SoL point)
    fill in what the profile stage does not report itself.
    """
    stage = verdict.stage("profile") if verdict is not None else None
    if stage is None or not stage.timings:
        return {}
    shapes: dict[str, dict[str, Any]] = {}
    for name, row in stage.timings.items():
        entry: dict[str, Any] = {"median_us": row.candidate.median_us}
        if (human or {}).get(name):
            entry["human_us"] = float((human or {})[name])
        point = (sol or {}).get(name)
        if point is not None:
            entry["sol_us"], entry["bound"] = point.sol_us, point.bound
        if row.candidate.host_bound:  # what limits the shape is forward()'s host time, whatever the SoL says
            entry["host_us"], entry["bound"] = row.candidate.host_median_us, "host"
        base = row.baselines()
        if base:
            entry["baselines"] = {b: t.median_us for b, t in base.items()}
            entry["speedups"] = {b: paired_ratio(t, row.candidate) for b, t in base.items()}
        shapes[name] = entry
    out: dict[str, Any] = {"shapes": shapes, "geomean_us": geomean(s["median_us"] for s in shapes.values())}
    for key in ("speedup_vs_human", *(f"speedup_vs_{b}" for b in BASELINES), "sol_fraction"):
        ratio = geomean(shape_ratio(s, key) for s in shapes.values())
        if ratio is not None:
            out[key] = ratio
    return out


def human_times(timing: Mapping[str, Any]) -> dict[str, float]:
    """shape -> µs of a timing record (used to keep the human kernel's session timing in the header)."""
    return {name: float(s["median_us"]) for name, s in timing.get("shapes", {}).items() if "median_us" in s}
