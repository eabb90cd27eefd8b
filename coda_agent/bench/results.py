"""The bench results files (``bench/results/<device>-<date>.json`` and ``...-e2e.json``): schemas shared by
``bench``, ``bench-e2e`` and the store."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, Field, computed_field

from ..measure.energy import StepEnergy
from ..measure.timing import Timing, fastest_round_ratio, paired_ratio

BENCH_SCHEMA_VERSION = 1


class BenchRow(BaseModel):
    """One task at one shape: the human kernel against the baselines."""

    task: str
    task_version: int
    task_hash: str | None = Field(default=None, description="the task's content hash (Task.content_hash); "
                                                            "None: not recorded")
    shape: str
    dims: dict[str, int]
    author: str = "human"
    correct: bool
    verdict_reason: str = ""
    candidate: Timing | None = None
    eager: Timing | None = None
    compiled: Timing | None = None
    compiled_max_autotune: Timing | None = Field(default=None,
                                                 description="torch.compile, mode max-autotune-no-cudagraphs")
    cublas: Timing | None = Field(default=None,
                                  description="the task's GEMM(s) alone through torch.matmul (cuBLAS)")
    sol_us: float | None = None
    flops: float
    min_bytes: float
    launches: int | None = None
    family: str = ""
    gemms: list[list[int]] = Field(default=[],
                                   description="the GEMM shapes [M, N, K] the cuBLAS baseline ran")
    pending: bool = Field(default=False,
                          description="checked but not timed yet: the bench stopped before its timing phase")

    @property
    def better_compile(self) -> Timing | None:
        """The faster torch.compile baseline (default or max-autotune) by its median: the tables' ratio's."""
        return self._faster_compile(lambda t: t.median_us)

    def _faster_compile(self, time_of: Callable[[Timing], float]) -> Timing | None:
        timed = [t for t in (self.compiled, self.compiled_max_autotune) if t is not None]
        return min(timed, key=time_of) if timed else None

    def ratio(self, baseline: str) -> float | None:
        """baseline time / candidate time (>1 means the candidate is faster), paired round by round
        (:func:`~coda_agent.measure.timing.paired_ratio`)."""
        base = getattr(self, baseline)
        if self.candidate is None or base is None:
            return None
        return paired_ratio(base, self.candidate)

    def fastest_ratio(self, baseline: str) -> float | None:
        """baseline time / candidate time at each side's fastest round
        (:func:`~coda_agent.measure.timing.fastest_round_ratio`): what the targets hold a kernel to. Against
        ``better_compile``, the compile mode whose fastest round is faster."""
        if baseline == "better_compile":
            base = self._faster_compile(lambda t: min(t.rounds_us, default=t.median_us))
        else:
            base = getattr(self, baseline)
        if self.candidate is None or base is None:
            return None
        return fastest_round_ratio(base, self.candidate)

    def tflops(self) -> float | None:
        """Achieved TFLOP/s of the candidate."""
        return self.flops / self.candidate.median_us / 1e6 if self.candidate else None

    def tbps(self) -> float | None:
        """Achieved TB/s of the candidate over the minimal byte count."""
        return self.min_bytes / self.candidate.median_us / 1e6 if self.candidate else None

    def pct_sol(self) -> float | None:
        """Speed of light as a percentage of the candidate's time (100 = at the roofline)."""
        if self.candidate is None or self.sol_us is None:
            return None
        return 100.0 * self.sol_us / self.candidate.median_us


class Measured(BaseModel):
    """What every committed bench figure names: when, by which command, on which device, packages and
    commit."""

    created: datetime
    command: str
    device: str
    driver: str = ""
    packages: dict[str, str] = {}
    git_commit: str | None = None


class BenchRun(Measured):
    """A whole bench invocation with everything its numbers depend on."""

    schema_version: int = BENCH_SCHEMA_VERSION
    peak_tflops_bf16: float | None = Field(default=None, description="measured at the start of the bench")
    peak_hbm_tbps: float | None = None
    peaks_method: str = ""
    timing_method: str = ""
    correctness_seeds: int = 0
    compile_modes: list[str] = Field(default=["default"], description="the torch.compile baselines timed")
    tasks: list[str] = Field(default=[], description="the tasks the command asked for (a stopped bench lacks "
                                                     "rows of some)")
    rows: list[BenchRow] = []

    def unchecked_tasks(self) -> list[str]:
        """Tasks asked for that have no rows yet: the bench stopped before their check finished."""
        have = {r.task for r in self.rows}
        return [t for t in self.tasks if t not in have]

    def finished_tasks(self) -> set[str]:
        """Tasks whose every row is final (timed, failed or refused), i.e. what ``bench --resume`` may
        keep."""
        tasks = {r.task for r in self.rows}
        return {t for t in tasks if not any(r.pending for r in self.rows if r.task == t)}


E2E_SCHEMA_VERSION = 1
#: End-to-end results files end in ``-e2e.json`` beside the suite bench's, which the store indexes (it skips
#: these).
E2E_SUFFIX = "-e2e"
def holds_no_rows(path: Path) -> bool:
    """A JSON file beside the bench's results that is another record, not a :class:`BenchRun` (which always
    has ``rows``): a ``bench --tune`` search, a probe's or the acceptance phase's output. The store skips it;
    one that does not parse, or has rows that do not, is a results file it cannot read."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return not isinstance(data, dict) or "rows" not in data


#: The end-to-end goal (issue 13): CODA's ops at least this much faster than the better torch.compile on the
#: non-attention time of a step.
NON_ATTENTION_GOAL = 1.15
#: The moonshot beside it (issue 45): the non-attention time within this factor of the step's GEMM floor
#: (``E2ERun.gemm_floor``).
FLOOR_MOONSHOT = 1.15
#: What a GPU profile of a step counts (``E2EVariant.kernels_measured``), and the kind its attention kernels
#: are summed under (``E2EVariant.by_kind``).
CUDA_KERNELS = "CUDA kernels"
ATTENTION_KIND = "attention (SDPA)"


class E2EConfig(BaseModel):
    """The Llama-3 stack and batch an end-to-end bench ran."""

    preset: str
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    vocab: int
    layers: int
    batch: int
    seq: int
    dtype: str = "bfloat16"

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


class KernelTime(BaseModel):
    """One kernel (on CPU: one op) of a profiled step, summed over its launches."""

    name: str
    count: int
    total_us: float


class KernelFile(BaseModel):
    """A kernel file the ``coda-kernels`` variant ran in place of a chain task's human kernel."""

    task: str
    path: str
    sha256: str = Field(description="the file's sha256: which version of it ran")


class KernelKind(BaseModel):
    """One kind of kernel (attention, the task kernels, GEMMs, glue...) of a profiled step, summed."""

    kind: str
    count: int
    total_us: float


class KernelGap(BaseModel):
    """A stretch of a profiled step in which no kernel ran on the GPU."""

    us: float
    before: str = Field(description="the kernel that ended it began after")
    after: str = Field(description="the kernel that ended it")


class GpuTimeline(BaseModel):
    """When the profiled step kept the GPU busy, from its first kernel's start to its last one's end: the rest
    is time the GPU waited on the host (a launch that came late, a synchronisation), which no kernel table
    shows."""

    span_us: float
    busy_us: float = Field(description="the union of the kernels' intervals")
    idle_by_next_kind: list[KernelKind] = Field(default=[], description=(
        "the idle time summed by the kind of kernel that ended each gap (bench.e2e.KERNEL_KINDS), largest "
        "first; count: gaps"))
    longest: list[KernelGap] = Field(default=[], description="the longest gaps, longest first")

    @property
    def idle_us(self) -> float:
        return self.span_us - self.busy_us


class PeakShare(BaseModel):
    """The blocks alive at a step's memory peak that one line of code allocated."""

    where: str = Field(description="path:line (function), or why there is none (bench.memory_peak)")
    bytes: int
    blocks: int


class PeakBreakdown(BaseModel):
    """What the step's own allocations held at their peak, by where they were made (bench.memory_peak)."""

    step_bytes: int = Field(description=("the most the step's allocations held at once (the weights, the "
                                         "batch and what the step before left are not counted)"))
    shares: list[PeakShare] = Field(default=[], description="largest first; the last may sum the rest")


class GradientCheck(BaseModel):
    """A CODA variant's gradients at a small batch against FP32 autograd, by the suite's tolerance rule
    (``coda_agent.torch.check``)."""

    tokens: int = Field(description="the batch the check ran at (batch x sequence)")
    passed: bool
    worst: str = Field(description="the gradient nearest its allowance, or furthest past it ('h': the "
                                   "input's)")
    worst_ratio: float = Field(description="that gradient's max-abs error over what the rule allows it (<= 1 "
                                           "passes)")
    failed: list[str] = Field(default=[], description="every gradient past its allowance")


class GemmProduct(BaseModel):
    """One GEMM product of the stack's training step, as the plain-PyTorch model runs it (``bench.e2e``)."""

    name: str = Field(description="whose product: the layer's projection or the head, and which pass")
    m: int
    n: int
    k: int
    count: int = Field(description="how many of it a step runs (one per layer for the layers')")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.count


class E2EVariant(BaseModel):
    """One way of running the stack's training step (forward + backward)."""

    name: str
    model: str = Field(description="CodaLlamaStack (the task kernels) or ReferenceLlamaStack (plain PyTorch)")
    compile_backend: str | None = Field(default=None, description="torch.compile's backend; None: eager")
    compile_mode: str | None = None
    step: Timing
    tokens_per_s: float
    non_attention_us: float = Field(description="the step's median less the layers' SDPA forward+backward "
                                                "median")
    loss: float | None = Field(default=None, description=(
        "the loss of one step at the bench's batch (the variants run the same weights); None: a run cut "
        "short before this variant's measures"))
    peak_memory_bytes: int | None = Field(default=None,
                                          description="torch.cuda.max_memory_allocated over one step, "
                                          "reset just before it; None on CPU")
    resident_bytes: int | None = Field(default=None, description="allocated before that step: every "
                                                                 "variant's weights and the batch")
    kernels_measured: str = Field(default="", description="what top_kernels counts: CUDA kernels, or CPU ops "
                                                          "without a GPU")
    kernel_total_us: float = Field(default=0.0, description="all the profiled step's kernels (ops), summed")
    top_kernels: list[KernelTime] = []
    by_kind: list[KernelKind] = Field(default=[], description="every profiled kernel (op), summed by what it "
                                                              "is (bench.e2e.KERNEL_KINDS), largest first")
    timeline: GpuTimeline | None = Field(default=None, description="the profiled step's GPU busy and idle "
                                                                   "time; None on a CPU")
    peak_breakdown: PeakBreakdown | None = Field(default=None, description=(
        "what one step's allocations held at their peak; None on a CPU"))
    energy: StepEnergy | None = Field(default=None, description=(
        "the GPU's joules a step, over a run of steps back to back; None on a CPU or without NVML's counter"))
    gradients: GradientCheck | None = Field(default=None, description="None: not checked (the plain models, "
                                                                      "and compiled CODA, which runs the "
                                                                      "same kernels)")


class E2ERun(Measured):
    """An end-to-end bench: the variants of one stack's step, with the provenance the suite bench records."""

    schema_version: int = E2E_SCHEMA_VERSION
    timing_method: str = ""
    attention_method: str = ""
    notes: list[str] = []
    config: E2EConfig
    attention: Timing = Field(description="one layer's SDPA forward+backward at the stack's shapes")
    variants: list[E2EVariant]
    kernel_files: list[KernelFile] = Field(default=[], description="what the coda-kernels variant ran in "
                                                                  "place of the human kernels")
    gemm_floor: Timing | None = Field(default=None, description=(
        "the step's GEMM products alone (gemm_products) on cuBLAS, back to back, timed with the steps: what "
        "the non-attention time would be if the epilogues, the glue and every other pass cost nothing"))
    gemm_products: list[GemmProduct] = []

    def variant(self, name: str) -> E2EVariant | None:
        return next((v for v in self.variants if v.name == name), None)

    @property
    def coda(self) -> E2EVariant:
        found = self.variant("coda")
        if found is None:
            raise ValueError("an end-to-end run without its coda variant")
        return found

    @property
    def best_compile(self) -> E2EVariant | None:
        """The faster torch.compile of the plain-PyTorch model (the goal's baseline)."""
        compiled = [v for v in self.variants if v.model == "ReferenceLlamaStack"
                    and v.compile_backend is not None]
        return min(compiled, key=lambda v: v.step.median_us) if compiled else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def speedups(self) -> dict[str, dict[str, float | None]]:
        """Per other variant: its time / CODA's, for the whole step (paired round by round) and for the
        non-attention time (of the medians) (>1: CODA faster)."""
        coda = self.coda
        out: dict[str, dict[str, float | None]] = {}
        for v in self.variants:
            if v is not coda:
                non_attention = (
                    v.non_attention_us / coda.non_attention_us if coda.non_attention_us > 0 else None
                )
                out[v.name] = {"step": paired_ratio(v.step, coda.step), "non_attention": non_attention}
        return out

    def over_floor(self, variant: E2EVariant) -> float | None:
        """``variant``'s non-attention time over the GEMM floor; None where the floor was not timed."""
        floor = self.gemm_floor
        return None if floor is None or floor.median_us <= 0 else variant.non_attention_us / floor.median_us

    @computed_field  # type: ignore[prop-decorator]
    @property
    def non_attention_goal_met(self) -> bool | None:
        """CODA >= NON_ATTENTION_GOAL x the better torch.compile on the non-attention time; None without
        both."""
        best = self.best_compile
        ratio = self.speedups[best.name]["non_attention"] if best is not None else None
        return None if ratio is None else ratio >= NON_ATTENTION_GOAL
