"""The verification plan: which stages, on which backend, at which shapes and seeds, within what time.

One object, owned by the verifier, so every caller (``verify``, ``bench``, ``run``, ``replay``) states the
same things the same way and a verdict can say exactly what was checked.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from ..measure.baselines import COMPILE_MODES
from ..tasks.model import Baseline

#: Stages on the CPU (emulator) and the sm_90a compile; ``tune_cpu`` is the GPU's ``tune`` on the emulator, where
#: configs are ignored: for tests.
CPU_STAGES = ("correctness",)
COMPILE_STAGES = ("compile",)
#: Stages that need a GPU; the timed ones among them need their device to themselves (timings must not overlap).
GPU_STAGES = ("gpu_correctness", "bench_prepare", "profile", "bench", "tune")
TIMED_STAGES = ("profile", "bench", "tune")
#: Seconds the tune stage may spend searching configs for one candidate (discovery and the final re-time come on top).
DEFAULT_TUNE_BUDGET_S = 300.0


class Plan(BaseModel):
    """What to check; the checker refuses a plan that would check nothing."""

    stages: list[str] = Field(default_factory=lambda: list(CPU_STAGES))
    backend: str = "torch"
    shape_set: str = "small"
    shape_names: list[str] | None = None
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2])
    timeout: float = Field(default=600.0, gt=0)
    compile_modes: list[str] = Field(
        default_factory=lambda: ["default", "max-autotune-no-cudagraphs"],
        description="the torch.compile baselines of the bench stage (the profile stage times the default mode)",
    )
    #: The tolerance baseline to judge outputs by, instead of the task's own (``tolerance.baseline``).
    tolerance_baseline: Baseline | None = None
    tune_budget_s: float = Field(default=DEFAULT_TUNE_BUDGET_S, gt=0, description="tune: seconds of config search per candidate")
    tune_cache: bool = Field(default=True, description="tune: reuse and record winners in the tuning cache (settings.cache_dir)")

    @field_validator("compile_modes")
    @classmethod
    def _known_modes(cls, v: list[str]) -> list[str]:
        unknown = [m for m in v if m not in COMPILE_MODES]
        if unknown:
            raise ValueError(f"unknown torch.compile mode(s) {', '.join(unknown)} (known: {', '.join(COMPILE_MODES)})")
        return v

    @field_validator("stages", "seeds")
    @classmethod
    def _not_empty(cls, v: list[object], info: ValidationInfo) -> list[object]:
        if not v:
            raise ValueError(f"a verification needs at least one of its {info.field_name}")
        return v
