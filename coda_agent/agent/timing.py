"""Speed facts the agent reasons with: nominal speed of light, and GPU timings read from a verdict.

The agent measures nothing itself. Timings come from the verifier's ``profile`` stage (GPU only); the
speed of light shown in prompts uses nominal H200 peaks, labelled as such, because a prompt must not
depend on a measurement the CPU-only path cannot make.

``Attempt.timing`` (see ``store/records.py``) holds what :func:`timing_from_verdict` returns::

    {"shapes": {"<shape>": {"median_us": 812.3, "human_us": 790.1, "sol_us": 480.2, "bound": "compute",
                            "baselines": {"eager": 1500.0, "compiled": 1100.0, "cublas": 700.0}}},
     "geomean_us": 812.3, "speedup_vs_human": 0.97, "speedup_vs_cublas": 0.86, "speedup_vs_compiled": 1.35,
     "sol_fraction": 0.59}

Ratios (other time / candidate time, > 1 is faster) are geometric means over the shapes that have both
numbers; a ratio that cannot be formed is absent. The ``speedup_vs_*`` keys are what a run's target names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..store.ranking import geomean, shape_ratio
from ..tasks.model import Task
from ..verifier.verdict import Verdict

NOMINAL_PEAK_TFLOPS = 989.0  # H200 SXM, bf16 dense tensor-core peak (datasheet)
NOMINAL_PEAK_TBPS = 4.8  # H200 SXM HBM3e bandwidth (datasheet)
NOMINAL_LABEL = (
    f"Nominal H200 peaks (datasheet, not measured): {NOMINAL_PEAK_TFLOPS:g} TFLOP/s bf16 dense, "
    f"{NOMINAL_PEAK_TBPS:g} TB/s HBM"
)
BASELINES = ("eager", "compiled", "cublas")


@dataclass(frozen=True)
class SolPoint:
    """Speed of light of one shape point under the nominal peaks."""

    shape: str
    dims: str
    flops: float
    bytes: float
    compute_us: float
    memory_us: float

    @property
    def sol_us(self) -> float:
        return max(self.compute_us, self.memory_us)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_us >= self.memory_us else "memory"


def speed_of_light(task: Task, set_name: str = "bench") -> list[SolPoint]:
    """SoL time = max(FLOPs / peak, minimal bytes / bandwidth) at each shape of ``set_name``."""
    points = []
    for p in task.shape(set_name):
        flops, nbytes = task.flops(p.dims), task.min_bytes(p.dims)
        points.append(
            SolPoint(
                shape=p.name,
                dims=", ".join(f"{k}={v}" for k, v in p.dims.items()),
                flops=flops,
                bytes=nbytes,
                compute_us=flops / (NOMINAL_PEAK_TFLOPS * 1e12) * 1e6,
                memory_us=nbytes / (NOMINAL_PEAK_TBPS * 1e12) * 1e6,
            )
        )
    return points


def timing_from_verdict(
    verdict: Verdict | None, human: Mapping[str, float] | None = None, sol: Mapping[str, SolPoint] | None = None
) -> dict[str, Any]:
    """The ``Attempt.timing`` record of a profiled verdict; ``{}`` when it was not timed.

    ``human`` (shape -> µs of the human kernel in this session) and ``sol`` (shape -> nominal SoL point)
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
        base = {b: t.median_us for b, t in row.baselines().items()}
        if base:
            entry["baselines"] = base
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
