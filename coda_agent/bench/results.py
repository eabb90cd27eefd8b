"""The bench results file (``bench/results/<device>-<date>.json``): schema shared by ``bench`` and the store."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from ..measure.timing import Timing

BENCH_SCHEMA_VERSION = 1


class BenchRow(BaseModel):
    """One task at one shape: the human kernel against the baselines."""

    task: str
    task_version: int
    shape: str
    dims: dict[str, int]
    author: str = "human"
    correct: bool
    verdict_reason: str = ""
    candidate: Timing | None = None
    eager: Timing | None = None
    compiled: Timing | None = None
    compiled_max_autotune: Timing | None = Field(default=None, description="torch.compile, mode max-autotune-no-cudagraphs")
    cublas: Timing | None = Field(default=None, description="the task's GEMM(s) alone through torch.matmul (cuBLAS)")
    sol_us: float | None = None
    flops: float
    min_bytes: float
    launches: int | None = None
    family: str = ""
    gemms: list[list[int]] = Field(default=[], description="the GEMM shapes [M, N, K] the cuBLAS baseline ran")
    pending: bool = Field(default=False, description="checked but not timed yet: the bench stopped before its timing phase")

    @property
    def better_compile(self) -> Timing | None:
        """The faster torch.compile baseline (default or max-autotune): the one the targets hold a kernel to."""
        timed = [t for t in (self.compiled, self.compiled_max_autotune) if t is not None]
        return min(timed, key=lambda t: t.median_us) if timed else None

    def ratio(self, baseline: str) -> float | None:
        """baseline time / candidate time (>1 means the candidate is faster)."""
        base = getattr(self, baseline)
        if self.candidate is None or base is None:
            return None
        return base.median_us / self.candidate.median_us

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


class BenchRun(BaseModel):
    """A whole bench invocation with everything its numbers depend on."""

    schema_version: int = BENCH_SCHEMA_VERSION
    created: datetime
    command: str
    device: str
    driver: str = ""
    packages: dict[str, str] = {}
    git_commit: str | None = None
    peak_tflops_bf16: float | None = Field(default=None, description="measured at the start of the bench")
    peak_hbm_tbps: float | None = None
    peaks_method: str = ""
    timing_method: str = ""
    correctness_seeds: int = 0
    compile_modes: list[str] = Field(default=["default"], description="the torch.compile baselines timed")
    rows: list[BenchRow] = []

    def finished_tasks(self) -> set[str]:
        """Tasks whose every row is final (timed, failed or refused), i.e. what ``bench --resume`` may keep."""
        tasks = {r.task for r in self.rows}
        return {t for t in tasks if not any(r.pending for r in self.rows if r.task == t)}
