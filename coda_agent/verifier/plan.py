"""The verification plan: which stages, on which backend, at which shapes and seeds, within what time.

One request type, owned by the verifier: each caller (the agent, the bench and its tuning, the ``verify``
command) builds a :class:`Plan` once, the executor's job carries it and ``verify()`` takes it, so a setting is
stated in one place, its default in :class:`Plan` alone, and a verdict can say exactly what was checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..measure.baselines import COMPILE_MODES
from ..measure.timing import FLUSH_BYTES
from ..tasks.model import DTYPE_BYTES, Baseline, ShapePoint, Task, TensorSpec

if TYPE_CHECKING:
    import torch

#: Stages on the CPU (emulator) and the sm_90a compile; ``tune_cpu`` is the GPU's ``tune`` on the emulator,
#: where configs are ignored: for tests.
CPU_STAGES = ("correctness",)
COMPILE_STAGES = ("compile",)
#: Stages that need a GPU; the timed ones among them need their device to themselves (timings must not
#: overlap).
GPU_STAGES = ("gpu_correctness", "bench_prepare", "profile", "bench", "tune")
TIMED_STAGES = ("profile", "bench", "tune")
#: The torch.compile baseline every timed candidate meets (the bench adds the slow-to-compile max-autotune).
PROFILE_COMPILE_MODES = ("default",)
#: The input seeds a plan checks unless told otherwise.
DEFAULT_SEEDS = (0, 1, 2)
#: Seconds the tune stage may spend searching configs for one candidate (discovery and the final re-time come
#: on top).
DEFAULT_TUNE_BUDGET_S = 300.0


class Plan(BaseModel):
    """What to check; the checker refuses a plan that would check nothing. Frozen: one request, shared by the
    threads and processes that carry it (a variant is a ``model_copy``)."""

    model_config = ConfigDict(frozen=True)

    stages: list[str] = Field(default_factory=lambda: list(CPU_STAGES))
    backend: str = "torch"
    shape_set: str = "small"
    shape_names: list[str] | None = None
    seeds: list[int] = Field(default_factory=lambda: list(DEFAULT_SEEDS))
    timeout: float = Field(default=600.0, gt=0)
    compile_modes: list[str] = Field(
        default_factory=lambda: list(COMPILE_MODES),
        description="the torch.compile baselines of the bench stage (the profile stage times the default "
                    "mode)",
    )
    #: The tolerance baseline to judge outputs by, instead of the task's own (``tolerance.baseline``).
    tolerance_baseline: Baseline | None = None
    tune_budget_s: float = Field(default=DEFAULT_TUNE_BUDGET_S, gt=0,
                                 description="tune: the stage's wall time per candidate, in seconds")
    tune_cache: bool = Field(default=True, description="tune: reuse and record winners in the tuning cache "
                                                       "(settings.cache_dir)")

    @property
    def needs_gpu(self) -> bool:
        return any(s in GPU_STAGES for s in self.stages)

    @property
    def timed(self) -> bool:
        """Whether it times: then it needs its device to itself (timings must not overlap)."""
        return any(s in TIMED_STAGES for s in self.stages)

    def points(self, task: Task) -> list[ShapePoint]:
        """The shapes of ``task`` it checks: its shape set, narrowed to ``shape_names`` when given."""
        return task.points(self.shape_set, self.shape_names)

    @field_validator("compile_modes")
    @classmethod
    def _known_modes(cls, v: list[str]) -> list[str]:
        unknown = [m for m in v if m not in COMPILE_MODES]
        if unknown:
            raise ValueError(f"unknown torch.compile mode(s) {', '.join(unknown)} (known: "
                             f"{', '.join(COMPILE_MODES)})")
        return v

    @field_validator("stages", "seeds")
    @classmethod
    def _not_empty(cls, v: list[object], info: ValidationInfo) -> list[object]:
        if not v:
            raise ValueError(f"a verification needs at least one of its {info.field_name}")
        return v


# --- input sets ---------------------------------------------------------------------------------------------

#: Added to the first seed for the seeds of the sets that are not the plan's own: the decoy and the stress
#: set.
DECOY_SEED_OFFSET, STRESS_SEED_OFFSET = 7919, 104729


@dataclass(frozen=True)
class InputSet:
    """One input set of the correctness check: a seed's draw of the task's inputs, or (``stress``) the stress
    set's, where the inputs the task stresses are drawn from its stress inits instead
    (:meth:`Task.stress_inits`)."""

    seed: int
    stress: bool = False

    def draw(self, task: Task, dims: dict[str, int], device: str) -> dict[str, torch.Tensor]:
        return task.make_inputs(dims, self.seed, device=device, stress=self.stress)


def input_sets(task: Task, seeds: Sequence[int]) -> tuple[list[InputSet], list[InputSet]]:
    """(the sets checked, the decoys) at each shape: one set per seed and the stress set when the task has
    one; a decoy, checked but not recorded, only when that makes a single set (so no call follows a call on
    the same inputs, and stale memory never holds the right answer)."""
    checked = [InputSet(s) for s in seeds]
    if task.stress_inits():
        checked.append(InputSet(seeds[0] + STRESS_SEED_OFFSET, stress=True))
    return checked, ([] if len(checked) > 1 else [InputSet(seeds[0] + DECOY_SEED_OFFSET)])


# --- device memory ------------------------------------------------------------------------------------------

#: Elements of an output the tolerance check compares at a time (``compare.py``): its FP64 temporaries are a
#: few buffers of this size (128 MiB each), never the output's full size.
CHUNK_ELEMENTS = 1 << 24
#: How many chunk-sized FP64 buffers a comparison holds at once at most.
CHUNK_BUFFERS = 4
#: Input sets the timing protocol cycles through at one shape (``gpu.ShapeTimer``).
TIMING_SETS = 3
#: The most bytes of references the timing protocol keeps for its sets (beyond it, one set's at a time).
TIMING_REFS_BYTES = 8 << 30
#: Stages whose memory :func:`memory_needs` estimates, by protocol.
_CHECKED, _TIMED = ("gpu_correctness",), ("bench_prepare", "profile", "bench", "tune")


def _bytes(specs: Sequence[TensorSpec], dims: dict[str, int], fp32: bool = False) -> int:
    """The bytes of these tensors at ``dims``, in their dtypes or (``fp32``) with floating ones in FP32."""
    return sum(math.prod(t.concrete_shape(dims))
               * (4 if fp32 and t.dtype.startswith(("bfloat", "float")) else DTYPE_BYTES[t.dtype])
               for t in specs)


@dataclass(frozen=True)
class MemoryNeed:
    """The estimated peak device memory of one verification at one shape: the checker's and its runner's, both
    on the same GPU (the larger of the correctness and timing protocols the plan runs)."""

    shape: ShapePoint
    checker_bytes: int
    runner_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.checker_bytes + self.runner_bytes


def memory_need(task: Task, point: ShapePoint, stages: Sequence[str], seeds: int) -> MemoryNeed:
    """The peak device memory of ``stages`` at ``point`` with ``seeds`` seeds, from the task's tensor sizes
    and its reference's measured working memory.

    With I an input set, O an output set (task dtypes), R the outputs in FP32 (the FP32 reference), W the most
    a reference call holds beyond its outputs (measured: :func:`..tasks.footprint.reference_working_bytes`; a
    cross-entropy's M x V logits and its logsumexp's temporary, whether or not it returns the logits), I32 the
    inputs upcast, S the input sets checked (:func:`input_sets`: the seeds, the stress set when the task has
    one, a decoy when that makes one set) and C = S + 1 calls kept:

    * correctness, checker: C x O (every kept call's outputs read back) + R + O (one seed's FP32 and
      task-dtype references) + 2 x I + I32 + W (the seed's inputs drawn again, their upcast and the eager
      call's copy; a reference call's working memory) + the comparison's chunks;
      its runner: 2 x S x I (the sets and their snapshots for the inputs-unchanged check) + C x O (the kept
      outputs) + 2 x R (the candidate's own working memory: the torch emulator's FP32 accumulator and
      epilogue) + the L2 flush buffer;
    * timing (profile, bench, tune), checker: 3 x I (the timing sets) + their references (all three up to
      :data:`TIMING_REFS_BYTES`, else one set's; more only out of memory free at the time, twice over: not
      counted here) + O (a checked call's outputs read back) + the largest of
      what comes and goes in turn: the eager baseline's call (O + W), a reference's (I32 + W), the cuBLAS
      baseline's operands and products, the comparison's chunks; its runner: 2 x 3 x I + 2 x O (a kept call's
      outputs and the current one's) + 2 x R + the flush buffer.

    Measured on the H200 at the Gemma-2 2B LM head (cross-entropy, M 8192, V 256000, K 2304, 3 seeds, the
    torch emulator as the candidate): correctness peaks of 45.3 GiB (checker) and 38.3 GiB (runner), estimated
    48.0 and 38.3; timing peaks of 24.3 and 30.5 GiB, estimated 38.6 and 30.5 (W came to the two M x V FP32
    temporaries then guessed). An estimate still: a candidate with larger temporaries needs more."""
    if not any(s in _CHECKED + _TIMED for s in stages):
        return MemoryNeed(point, 0, 0)
    from ..tasks.footprint import reference_working_bytes  # runs the reference (torch): only for a GPU stage

    dims = point.dims
    inp, inp32 = _bytes(task.inputs, dims), _bytes(task.inputs, dims, fp32=True)
    out, ref = _bytes(task.outputs, dims), _bytes(task.outputs, dims, fp32=True)
    largest = max(math.prod(t.concrete_shape(dims)) for t in task.outputs)
    work = reference_working_bytes(task, dims)
    chunks = CHUNK_BUFFERS * 8 * min(CHUNK_ELEMENTS, largest)
    checker = runner = 0
    if any(s in _CHECKED for s in stages):
        sets = sum(map(len, input_sets(task, range(seeds))))
        calls = sets + 1
        checker = calls * out + ref + out + 2 * inp + inp32 + work + chunks
        runner = 2 * sets * inp + calls * out + 2 * ref + FLUSH_BYTES
    if any(s in _TIMED for s in stages):
        refs = (ref + out) * (TIMING_SETS if (ref + out) * TIMING_SETS <= TIMING_REFS_BYTES else 1)
        gemms = sum(2 * (m * k + n * k + m * n) for m, n, k in task.gemm_shapes(dims))
        checker = max(checker, TIMING_SETS * inp + refs + out + max(out + work, inp32 + work, gemms, chunks))
        runner = max(runner, 2 * TIMING_SETS * inp + 2 * out + 2 * ref + FLUSH_BYTES)
    return MemoryNeed(point, checker, runner)


def memory_needs(task: Task, plan: Plan) -> list[MemoryNeed]:
    """:func:`memory_need` at every shape the plan selects."""
    return [memory_need(task, p, plan.stages, len(plan.seeds)) for p in plan.points(task)]


def memory_refusal(task: Task, plan: Plan, free_bytes: int, total_bytes: int | None = None) -> str | None:
    """One line saying the plan cannot fit a device with ``free_bytes`` free, with the numbers (the largest
    shape that does not fit); None when every shape fits, or when the plan runs no GPU stage."""
    too_big = [n for n in memory_needs(task, plan) if n.total_bytes > free_bytes]
    if not too_big:
        return None
    worst = max(too_big, key=lambda n: n.total_bytes)
    dims = ", ".join(f"{k}={v}" for k, v in worst.shape.dims.items())
    of = f" of {_gib(total_bytes)}" if total_bytes else ""
    return (f"task {task.name} does not fit this GPU: at {plan.shape_set} shape {worst.shape.name} ({dims}) "
            f"with {len(plan.seeds)} seed(s) the checker needs about {_gib(worst.checker_bytes)} and its "
            f"runner {_gib(worst.runner_bytes)} ({_gib(worst.total_bytes)} in all), and the device has "
            f"{_gib(free_bytes)} free{of}")


def device_memory_refusal(task: Task, plan: Plan) -> str | None:
    """:func:`memory_refusal` against the current CUDA device's free memory (``torch.cuda.mem_get_info``);
    None on a machine without one, or for a plan with no GPU stage (nothing is initialised then)."""
    if not any(s in _CHECKED + _TIMED for s in plan.stages):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return memory_refusal(task, plan, int(free), int(total))


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"
