"""Verdicts: what the verifier concluded, with a reason a person or an LLM can act on.

Pure data (pydantic), so a verdict crosses the worker-process boundary as JSON and lands unchanged in
run records.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field, model_validator

from ..measure.baselines import BASELINES
from ..measure.timing import Timing
from ..primitives import Config
from ..tasks.model import Baseline


class Outcome(str, Enum):
    """Every way a candidate can end; the first five are failures a model can fix in its code."""

    PASSED = "passed"
    STATIC_REJECTED = "static_rejected"  # the AST check refused the source
    COMPILE_ERROR = "compile_error"  # QuACK/CuTe DSL could not build a kernel
    RUNTIME_ERROR = "runtime_error"  # forward() raised (contract violation, shape error...)
    WRONG_OUTPUT = "wrong_output"  # ran, but an output is missing, misshaped or outside tolerance
    CHEAT_DETECTED = "cheat_detected"  # mutated inputs, non-determinism, torch matmul, side streams...
    OVER_LAUNCH_BUDGET = "over_launch_budget"
    TIMEOUT = "timeout"
    CRASH = "crash"  # the worker process died (segfault, CUDA fault, OOM)
    INFRA_ERROR = "infra_error"  # the harness itself failed; not the candidate's fault


class OutputCheck(BaseModel):
    """One output at one shape and seed, against the FP32 reference."""

    output: str
    shape_point: str
    seed: int
    stress: bool = Field(default=False,
                         description="on the stress input set (large magnitudes), drawn with this seed")
    ok: bool
    max_abs_err: float | None = None
    allowed: float | None = None
    lowp_err: float | None = Field(default=None, description="error of the low-precision baseline the "
                                                             "tolerance scales with")
    baseline: Baseline = Field(default="eager", description="that baseline: eager (the reference in the task "
                                                            "dtype) or single_rounding")
    worst_index: list[int] | None = None
    worst_value: float | None = None
    expected_value: float | None = None
    rounded_to: str | None = Field(default=None, description="the 16-bit dtype the worst element of an FP32 "
                                                             "output is the expected value rounded to (an "
                                                             "intermediate rounded on its way), if any")
    factor: float | None = Field(default=None, description="s where the output is s x the expected one "
                                                           "throughout (a constant factor off), if so")
    reason: str = ""

    @property
    def input_set(self) -> str:
        """Where it was checked: ``shape/seed``, or ``shape/stress`` on the stress set."""
        return f"{self.shape_point}/{'stress' if self.stress else self.seed}"

    @property
    def error_ratio(self) -> float | None:
        """The error over the allowed error (<= 1 passes); None when either is unknown."""
        if self.max_abs_err is None or not self.allowed:
            return None
        return self.max_abs_err / self.allowed


class ShapeTiming(BaseModel):
    """One shape of a timing stage: the candidate and the baselines timed with it (medians and spread, µs)."""

    dims: dict[str, int]
    candidate: Timing
    eager: Timing | None = None
    compiled: Timing | None = None
    compiled_max_autotune: Timing | None = None
    cublas: Timing | None = None
    seconds: dict[str, float] = Field(default_factory=dict, description=(
        "where the shape's wall time went: setup (input sets made and sent), warm-up (first calls: compiles, "
        "plans; 'warm-up: <variant>' each variant's, 'warm-up: sizing' the rounds sized), timed (the traced "
        "and timed batches), close; the timed rounds split into 'timed: traced' (the candidate's traced "
        "batches, their traces judged), 'timed: candidate' (its timed batches), 'timed: transfer' (kept "
        "outputs fetched from the runner), 'timed: checks' (the references and the comparison) and 'timed: "
        "<baseline>' each baseline's batches (records before them kept 'timed: baselines')"))

    def baselines(self) -> dict[str, Timing]:
        return {k: t for k in BASELINES if (t := getattr(self, k)) is not None}


class TunedGemm(BaseModel):
    """One gemm call the tune stage searched at one shape: as written, what was tried, what won."""

    epilogue: str
    mnk: tuple[int, int, int]
    mode: str
    written: Config | None = Field(default=None, description="the config it ran with as written (None: "
                                                             "QuACK's arch default)")
    tuned: Config | None = Field(default=None,
                                 description="the fastest config found; None when none beat the written one")
    tried_us: dict[str, float] = Field(default_factory=dict, description=(
        "config label -> the GPU's median µs (CUDA events) of the whole forward() with it"))
    failed: dict[str, str] = Field(default_factory=dict,
                                   description="config label -> why forward() could not be timed with it")
    seconds: dict[str, dict[str, float]] = Field(default_factory=dict, description=(
        "config label -> where its proposal's wall clock went: 'proposal' in all, and the timing protocol's "
        "parts (its 'warm-up' holds the build of the config's kernels): what a budget buys"))
    cached: bool = Field(default=False,
                         description="the winner came from the tuning cache; nothing was searched")
    untried: int = Field(default=0,
                         description="configs of its space the stage's budget ended before they were timed")


#: A tuned schedule is pinned only where it beats the configs as written by at least this factor.
MIN_GAIN = 1.01


class ShapeTuning(BaseModel):
    """The tune stage at one shape: forward() as written and under the tuned schedule, timed interleaved."""

    dims: dict[str, int]
    before: Timing
    after: Timing
    calls: list[TunedGemm]

    @property
    def gain(self) -> float:
        """As-written GPU time over tuned (> 1: the schedule is faster), by :attr:`Timing.gpu_us`."""
        return self.before.gpu_us / self.after.gpu_us if self.after.gpu_us > 0 else 1.0

    def kept(self, min_gain: float = MIN_GAIN) -> bool:
        """Whether the search's winners are pinned at this shape: they won the final comparison by
        ``min_gain`` (a call's ``tuned`` is the search's fastest either way)."""
        return self.gain >= min_gain


class StageMemory(BaseModel):
    """A GPU stage's peak device memory: the checker's (this process's allocations through PyTorch, peak reset
    when the stage began; process-wide, so it holds any verification sharing the process) and its runners'
    (the largest peak a runner reported, PyTorch's count in that process: what the candidate allocated through
    it)."""

    checker_peak_bytes: int | None = Field(default=None, ge=0)
    runner_peak_bytes: int | None = Field(default=None, ge=0)
    device_total_bytes: int | None = Field(default=None, ge=0, description="the device's memory, for scale")

    def describe(self) -> str:
        """Compact, in GiB: ``peak checker 40.2 + runner 30.5 of 139.8 GiB`` ("" when nothing was
        measured)."""
        parts = [f"{who} {v / (1 << 30):.1f}" for who, v in (("checker", self.checker_peak_bytes),
                                                             ("runner", self.runner_peak_bytes))
                 if v is not None]
        total = f" of {self.device_total_bytes / (1 << 30):.1f}" if self.device_total_bytes else ""
        return f"peak {' + '.join(parts)}{total} GiB" if parts else ""


class StageResult(BaseModel):
    """One verifier stage (static, compile, correctness, gpu_correctness, profile, bench, tune)."""

    stage: str
    outcome: Outcome
    reason: str = ""
    seconds: float = 0.0
    checks: list[OutputCheck] = []
    timings: dict[str, ShapeTiming] = Field(default_factory=dict, description="profile / bench: per shape")
    tuning: dict[str, ShapeTuning] = Field(default_factory=dict, description="tune / tune_cpu: per shape")
    details: dict[str, object] = {}
    memory: StageMemory | None = Field(default=None,
                                       description="GPU stages: peak device memory (None: not measured)")
    seconds_by_part: dict[str, float] = Field(default_factory=dict, description=(
        "where the stage's wall time went, part by part (seconds; what no part holds is the rest of "
        ":attr:`seconds`): 'runner start' and 'runner stop' in every stage with a runner of its own, "
        "'runner reset' where it takes over an earlier stage's (the GPU's gpu_correctness, then profile), "
        "'runner stop' in the last stage of those; 'release' in a GPU stage (the earlier stage's cached "
        "device memory handed back); correctness: "
        "'inputs' (drawn and sent), 'warm-up', 'candidate' (its checked calls), 'transfer' (outputs fetched, "
        "inputs dropped), 'reference FP32', 'reference dtype', 'checks', and on the CPU 'discover' "
        "(forward() on meta tensors at the bench shapes); compile: 'build', 'discover', 'build bench "
        "configs'; profile / bench: its "
        "shapes' :attr:`ShapeTiming.seconds` summed (a phase's parts in place of the phase: 'warm-up: "
        "<variant>', 'timed: <part>'); tune: 'traced call', 'builds', 'search', 'comparison', 'close'"))

    def time_parts(self) -> dict[str, float]:
        """:attr:`seconds_by_part` with the rest of the stage's time as 'other' (empty when no part was
        recorded)."""
        if not self.seconds_by_part:
            return {}
        rest = self.seconds - sum(self.seconds_by_part.values())
        return {**self.seconds_by_part, **({"other": rest} if rest > 0.005 else {})}

    def describe_time(self) -> str:
        """One line: ``gpu_correctness 51.9 s: runner start 6.1, reference FP32 20.3, ..., other 4.1``."""
        parts = ", ".join(f"{k} {_secs(v)}" for k, v in self.time_parts().items())
        return f"{self.stage} {_secs(self.seconds)} s" + (f": {parts}" if parts else "")

    @model_validator(mode="before")
    @classmethod
    def _timings_of_schema_1(cls, data: Any) -> Any:
        """Run records of schema 1 kept a timing stage's shapes untyped in ``details['shapes']``."""
        if isinstance(data, dict) and not data.get("timings") and data.get("stage") in ("profile", "bench"):
            shapes = (data.get("details") or {}).get("shapes")
            if isinstance(shapes,
                          dict) and all(isinstance(v, dict) and "candidate" in v for v in shapes.values()):
                details = {k: v for k, v in data["details"].items() if k != "shapes"}
                timings = {k: {"dims": {}, **v} for k, v in shapes.items()}
                data = {**data, "timings": timings, "details": details}
        return data


def _secs(v: float) -> str:
    """Seconds to a tenth, or a hundredth under one (a CPU stage's parts)."""
    return f"{v:.1f}" if v >= 1 else f"{v:.2f}"


#: What torch.OutOfMemoryError says when the caching allocator cannot get device memory.
GPU_OOM_MARK = "CUDA out of memory"


class Verdict(BaseModel):
    """The verifier's conclusion on one candidate for one task."""

    task: str
    task_version: int
    backend: str
    outcome: Outcome
    reason: str = ""
    sandbox: str = Field(default="",
                         description="how the candidate was isolated: bwrap, or process (no OS sandbox)")
    runner_user: str = Field(default="",
                             description="the user the runners ran as: nobody, or uid N (the checker's)")
    stages: list[StageResult] = []
    timings: dict[str, object] = {}

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASSED

    @property
    def out_of_gpu_memory(self) -> bool:
        """Whether a GPU allocation failed on the way (the candidate's or the checker's). On a GPU that other
        verifications shared, that says more about them than about this candidate: executors run it again
        alone."""
        return not self.passed and GPU_OOM_MARK in self.model_dump_json()

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.stage == name), None)

    def worst_checks(self) -> list[OutputCheck]:
        """Per output, the check with the largest error ratio (the table people and models read)."""
        worst: dict[str, OutputCheck] = {}
        for st in self.stages:
            for c in st.checks:
                cur = worst.get(c.output)
                if cur is None or _ratio(c) > _ratio(cur) or (cur.ok and not c.ok):
                    worst[c.output] = c
        return list(worst.values())


def _ratio(c: OutputCheck) -> float:
    """The error ratio for ordering: a failure with no error figure (missing, misshaped) ranks worst."""
    if c.error_ratio is not None:
        return c.error_ratio
    return float("inf") if not c.ok and c.max_abs_err is None else 0.0
