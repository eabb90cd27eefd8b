"""GPU stages of the verifier: ``gpu_correctness``, ``profile``, ``bench`` and ``bench_prepare``.

Imported by the worker when present (it needs no GPU to import, so the logic is testable on a CPU).

``gpu_correctness`` per shape: a warm-up call (builds the kernels), one call under the CUDA profiler (the
launch count against the task's budget; no cuBLAS/torch matmul kernel; nothing on a side stream; the GEMM
must run as a QuACK kernel), then per seed candidate -> reference -> candidate, each on freshly cloned
inputs, with every uninitialised allocation poisoned (see :func:`poisoned_allocations`).

How unwritten outputs are made visible: while the candidate runs, PyTorch's deterministic mode with
``fill_uninitialized_memory`` is on, so every ``torch.empty``-family allocation (the candidate's own
and QuACK's output and scratch buffers alike) comes back filled with NaN (integers: their maximum).
An element no kernel writes stays NaN and fails the check; stale data from an earlier call (the
reference's freed output, say) can never show through. ``warn_only`` keeps ops without a deterministic
variant working. The profiled call runs without poisoning, so fill kernels never count as launches.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from ..bench.baselines import baseline_variants
from ..bench.profiler import Clock, RepPlan, time_interleaved
from ..primitives import backend
from ..tasks.model import ShapePoint, Task
from .candidate import candidate_trace
from .compare import check_outputs
from .stages import Context, clone, references, stage
from .verdict import Outcome, OutputCheck, StageResult

KernelKind = Literal["quack", "matmul", "other"]

#: CuTe DSL kernels that QuACK builds: ``kernel_cutlass_kernel_quack...`` (the GEMM + epilogue).
QUACK_KERNEL = re.compile(r"^kernel_cutlass_kernel_quack")
#: cuBLAS/cuBLASLt, CUTLASS-in-cuBLAS and Inductor matmul kernels: a GEMM that bypassed primitives.gemm.
MATMUL_KERNEL = re.compile(
    r"nvjet|gemm|gemv|xmma|cublas|cutlass|wgmma|tensorop|[sh]1688|[sh]16816|splitKreduce|dot_kernel|triton_tem",
    re.IGNORECASE,
)


def classify_kernel(name: str) -> KernelKind:
    """``quack`` for QuACK's CuTe DSL kernels, ``matmul`` for cuBLAS-style GEMMs, else ``other``."""
    if QUACK_KERNEL.match(name):
        return "quack"
    if MATMUL_KERNEL.search(name):
        return "matmul"
    return "other"


@dataclass(frozen=True)
class KernelEvent:
    """One kernel the profiler saw: its name, stream and launch order (CUPTI correlation id)."""

    name: str
    stream: int
    order: int

    @property
    def kind(self) -> KernelKind:
        return classify_kernel(self.name)


def kernels_from_chrome_trace(trace: Mapping[str, Any]) -> list[KernelEvent]:
    """Kernel events of a ``torch.profiler`` Chrome trace, in launch order."""
    events = []
    for e in trace.get("traceEvents", []):
        if e.get("cat") != "kernel":
            continue
        args = e.get("args", {})
        order = args.get("correlation", e.get("ts", 0))
        events.append(KernelEvent(name=str(e.get("name", "")), stream=int(args.get("stream", e.get("tid", -1))), order=int(order)))
    return sorted(events, key=lambda k: k.order)


@dataclass
class LaunchTrace:
    """The kernels one forward() launched; the harness's marker kernel (launched first) names the stream."""

    main_stream: int
    kernels: list[KernelEvent] = field(default_factory=list)

    @classmethod
    def from_events(cls, events: list[KernelEvent]) -> LaunchTrace:
        if not events:
            raise RuntimeError("the CUDA profiler recorded no kernels, not even the harness's marker (is CUPTI available?)")
        marker, *rest = sorted(events, key=lambda k: k.order)
        return cls(main_stream=marker.stream, kernels=rest)

    @property
    def launches(self) -> int:
        return len(self.kernels)

    def of_kind(self, kind: KernelKind) -> list[KernelEvent]:
        return [k for k in self.kernels if k.kind == kind]

    @property
    def side_stream(self) -> list[KernelEvent]:
        return [k for k in self.kernels if k.stream != self.main_stream]

    def problem(self, task: Task, shape: str) -> tuple[Outcome, str] | None:
        """The first rule the trace breaks, with what to change; None when it breaks none."""
        matmul = self.of_kind("matmul")
        if matmul:
            return Outcome.CHEAT_DETECTED, (
                f"at shape {shape}, forward() launched a cuBLAS/torch matmul kernel ({_short(matmul[0].name)}): "
                "every GEMM must run through primitives.gemm, fused with its epilogue"
            )
        side = self.side_stream
        if side:
            return Outcome.CHEAT_DETECTED, (
                f"at shape {shape}, forward() launched {len(side)} kernel(s) on a side stream "
                f"({_short(side[0].name)}): all work must run on the caller's stream"
            )
        if task.gemms and not self.of_kind("quack"):
            return Outcome.CHEAT_DETECTED, (
                f"at shape {shape}, no GEMM kernel ran through primitives.gemm on a repeated call (kernels: "
                f"{', '.join(_short(k.name) for k in self.kernels[:4]) or 'none'}); every call must compute the task's "
                "GEMM with primitives.gemm, not another way and not from a cache of an earlier call"
            )
        if self.launches > task.launch_budget:
            names = ", ".join(_short(k.name, 50) for k in self.kernels)
            return Outcome.OVER_LAUNCH_BUDGET, (
                f"at shape {shape}, forward() launched {self.launches} kernels, over the task's budget of "
                f"{task.launch_budget} ({names}); move host-side glue into the epilogue or merge steps"
            )
        return None

    def describe(self) -> dict[str, object]:
        return {
            "launches": self.launches,
            "quack_kernels": len(self.of_kind("quack")),
            "kernels": [_short(k.name, 90) for k in self.kernels],
        }


def _short(name: str, limit: int = 70) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def record_launches(fn: Callable[[], object]) -> LaunchTrace:
    """Profile one call of ``fn`` on every stream; a marker kernel launched first identifies the caller's stream."""
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        marker.add_(1)
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(prefix="coda_trace_") as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return LaunchTrace.from_events(kernels_from_chrome_trace(trace))


@contextmanager
def poisoned_allocations() -> Iterator[None]:
    """While active, uninitialised allocations (``torch.empty`` & co.) are NaN-filled (integers: max value)."""
    import torch.utils.deterministic as det

    was_on, was_warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det.fill_uninitialized_memory = True  # type: ignore[attr-defined]
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)
            det.fill_uninitialized_memory = was_fill  # type: ignore[attr-defined]


# --- gpu_correctness ----------------------------------------------------------------------------------


class _Reject(Exception):
    """Ends the check of one shape with an outcome and a reason."""

    def __init__(self, outcome: Outcome, reason: str) -> None:
        super().__init__(reason)
        self.outcome, self.reason = outcome, reason


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _forward(ctx: Context, inputs: dict[str, torch.Tensor], device: str, point: ShapePoint, poison: bool = False) -> Any:
    """One candidate call, completed on the device (a side stream's work too); errors become a rejection."""
    try:
        with torch.no_grad():
            if poison:
                with poisoned_allocations():
                    out = ctx.candidate.forward(**inputs, **ctx.task.constants)
            else:
                out = ctx.candidate.forward(**inputs, **ctx.task.constants)
        _sync(device)
    except Exception as exc:
        raise _Reject(
            Outcome.RUNTIME_ERROR,
            f"forward() raised at shape {point.name} {point.dims}:\n{candidate_trace(exc, ctx.candidate_path)}",
        ) from None
    return out


def _storages(out: Any) -> set[int]:
    if not isinstance(out, Mapping):
        return set()
    return {v.untyped_storage().data_ptr() for v in out.values() if isinstance(v, torch.Tensor) and v.numel()}


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.double() - b.double()).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    return float(d.max()) if d.numel() else 0.0


@dataclass
class _ShapeOutcome:
    outcome: Outcome
    reason: str
    checks: list[OutputCheck]
    info: dict[str, object]


def check_shape(ctx: Context, point: ShapePoint, device: str = "cuda", trace: bool = True) -> _ShapeOutcome:
    """The GPU correctness protocol at one shape (module docstring); never raises for candidate faults."""
    task, checks = ctx.task, []
    info: dict[str, object] = {"dims": point.dims}
    try:
        first = task.make_inputs(point.dims, ctx.seeds[0], device=device)
        _forward(ctx, clone(first), device, point)  # warm-up: builds the kernels, grows the allocator
        if trace and device == "cuda":
            launches = record_launches(lambda: _forward(ctx, clone(first), device, point))
            info.update(launches.describe())
            problem = launches.problem(task, point.name)
            if problem:
                raise _Reject(*problem)
        held: list[Any] = []  # every earlier output, kept alive: a reused buffer can only be a cache
        previous: Any = None
        for seed in ctx.seeds:
            inputs = first if seed == ctx.seeds[0] else task.make_inputs(point.dims, seed, device=device)
            mine = clone(inputs)
            out1 = _forward(ctx, mine, device, point, poison=True)
            changed = [k for k in inputs if not torch.equal(inputs[k], mine[k])]
            if changed:
                raise _Reject(Outcome.CHEAT_DETECTED, f"at shape {point.name}, forward() modified its inputs {changed}; inputs are read-only")
            del mine
            ref32, reflp = references(task, inputs)
            out2 = _forward(ctx, clone(inputs), device, point, poison=True)
            reused = (_storages(out1) | _storages(out2)) & set().union(*(_storages(o) for o in held)) if held else set()
            if reused or (_storages(out1) & _storages(out2)):
                raise _Reject(
                    Outcome.CHEAT_DETECTED,
                    f"at shape {point.name} seed {seed}, forward() returned a buffer it had already returned from an "
                    "earlier call (an answer cached across calls); compute every output from the current inputs",
                )
            found = check_outputs(task, out1, ref32, reflp, point.dims, point.name, seed)
            checks.extend(found)
            failed = [c for c in found if not c.ok]
            if failed:
                stale = [c.output for c in failed if previous is not None and _same(out1.get(c.output), previous.get(c.output))]
                if stale:
                    raise _Reject(
                        Outcome.CHEAT_DETECTED,
                        f"at shape {point.name} seed {seed}, output {stale[0]!r} equals what forward() returned for the "
                        "previous inputs (an answer cached across calls); compute every output from the current inputs",
                    )
                raise _Reject(Outcome.WRONG_OUTPUT, failed[0].reason)
            _check_agreement(task, out1, out2, found, point, seed, info)
            del ref32, reflp
            held += [out1, out2]
            previous = out1
    except _Reject as rej:
        return _ShapeOutcome(rej.outcome, rej.reason, checks, info)
    return _ShapeOutcome(Outcome.PASSED, "", checks, info)


def _check_agreement(
    task: Task, out1: Mapping[str, Any], out2: Any, found: list[OutputCheck], point: ShapePoint, seed: int, info: dict[str, object]
) -> None:
    """The second run must match the first: bitwise, or at least within the tolerance of the check.

    Bitwise is not required (a reduction may legitimately vary its order), but a difference beyond the
    tolerance means the result depends on memory contents or timing.
    """
    allowed = {c.output: c.allowed for c in found if c.allowed is not None}
    for spec in task.outputs:
        a, b = out1.get(spec.name), out2.get(spec.name) if isinstance(out2, Mapping) else None
        if _same(a, b):
            continue
        if not isinstance(b, torch.Tensor) or not isinstance(a, torch.Tensor) or b.shape != a.shape:
            raise _Reject(Outcome.CHEAT_DETECTED, f"at shape {point.name}, the second call returned no matching {spec.name!r}")
        diff = _max_diff(a, b)
        limit = allowed.get(spec.name, 0.0)
        if diff > limit:
            raise _Reject(
                Outcome.CHEAT_DETECTED,
                f"at shape {point.name} seed {seed}, two calls on identical inputs disagree on {spec.name!r} by {diff:.3g} "
                f"(allowed {limit:.3g}): the result depends on memory contents or timing",
            )
        drifted = info.setdefault("not_bitwise_reproducible", [])
        assert isinstance(drifted, list)
        drifted.append(spec.name)


def run_correctness(ctx: Context, device: str = "cuda", backend_name: str = "quack", trace: bool = True) -> StageResult:
    """Every selected shape (a candidate fault at one shape does not hide the others, except a crash or cheat)."""
    t0 = time.perf_counter()
    backend.set_backend(backend_name)
    torch.backends.cuda.matmul.allow_tf32 = False  # the FP32 reference must be FP32
    torch.backends.cudnn.allow_tf32 = False
    name = "gpu_correctness"
    try:
        ctx.candidate  # noqa: B018 - import now, so an import error is reported as such
    except Exception as exc:
        return StageResult(stage=name, outcome=Outcome.RUNTIME_ERROR, reason=f"importing the candidate failed:\n{candidate_trace(exc, ctx.candidate_path)}")
    shapes: dict[str, dict[str, object]] = {}
    checks: list[OutputCheck] = []
    first_bad: _ShapeOutcome | None = None
    for point in ctx.shape_points():
        res = check_shape(ctx, point, device, trace)
        checks.extend(res.checks)
        shapes[point.name] = {"outcome": res.outcome.value, "reason": res.reason, **res.info}
        if res.outcome is not Outcome.PASSED:
            first_bad = first_bad or res
            if res.outcome in (Outcome.RUNTIME_ERROR, Outcome.CHEAT_DETECTED):
                break
        if device == "cuda":
            torch.cuda.empty_cache()
    details: dict[str, object] = {"shapes": shapes, "seeds": list(ctx.seeds), "device": device}
    if first_bad is not None:
        return StageResult(stage=name, outcome=first_bad.outcome, reason=first_bad.reason, seconds=time.perf_counter() - t0, checks=checks, details=details)
    n = len(ctx.shape_points())
    return StageResult(
        stage=name, outcome=Outcome.PASSED, seconds=time.perf_counter() - t0, checks=checks, details=details,
        reason=f"all outputs within tolerance on {n} {ctx.shape_set} shapes x {len(ctx.seeds)} seeds, launch budget kept",
    )


@stage("gpu_correctness")
def gpu_correctness(ctx: Context) -> StageResult:
    """Real QuACK kernels on the GPU against the FP32 reference, with the anti-cheat checks above."""
    if not torch.cuda.is_available():
        return StageResult(stage="gpu_correctness", outcome=Outcome.INFRA_ERROR, reason="no CUDA GPU on this worker")
    return run_correctness(ctx)


# --- timing -------------------------------------------------------------------------------------------


def run_timing(ctx: Context, with_compile: bool, device: str = "cuda", backend_name: str = "quack", plan: RepPlan | None = None) -> StageResult:
    """Time the candidate interleaved with the baselines at every selected shape (seed-0 inputs)."""
    name = "bench" if with_compile else "profile"
    t0 = time.perf_counter()
    backend.set_backend(backend_name)
    clock = Clock(device)
    shapes: dict[str, dict[str, object]] = {}
    for point in ctx.shape_points():
        inputs = ctx.task.make_inputs(point.dims, ctx.seeds[0], device=device)
        variants: dict[str, Callable[[], object]] = {
            "candidate": lambda inputs=inputs: ctx.candidate.forward(**inputs, **ctx.task.constants)  # type: ignore[misc]
        }
        variants.update(baseline_variants(ctx.task, point.dims, inputs, device=device, with_compile=with_compile))
        try:
            with torch.no_grad():
                timings = time_interleaved(variants, clock, plan or RepPlan())
        except Exception as exc:
            return StageResult(
                stage=name, outcome=Outcome.RUNTIME_ERROR, seconds=time.perf_counter() - t0, details={"shapes": shapes},
                reason=f"timing at shape {point.name} failed:\n{candidate_trace(exc, ctx.candidate_path)}",
            )
        shapes[point.name] = {"dims": point.dims, **{k: t.model_dump() for k, t in timings.items()}}
        del inputs, variants
    summary = "; ".join(
        f"{s}: {d['candidate']['median_us']:.0f} µs" for s, d in shapes.items()  # type: ignore[index]
    )
    return StageResult(
        stage=name, outcome=Outcome.PASSED, seconds=time.perf_counter() - t0, reason=f"median {summary}",
        details={"shapes": shapes, "timing_method": TIMING_METHOD},
    )


TIMING_METHOD = (
    "CUDA events per call on the current stream; L2 flushed (256 MiB memset) before every call; 3 warm-up calls, "
    "then candidate and baselines interleaved rep by rep in rotating order, reps sized for ~0.15 s per variant "
    "(15-60); median with p10/p90"
)


@stage("profile")
def profile(ctx: Context) -> StageResult:
    """The candidate's time at each shape, interleaved with eager PyTorch and cuBLAS alone."""
    if not torch.cuda.is_available():
        return StageResult(stage="profile", outcome=Outcome.INFRA_ERROR, reason="no CUDA GPU on this worker")
    return run_timing(ctx, with_compile=False)


@stage("bench")
def bench(ctx: Context) -> StageResult:
    """As ``profile``, plus torch.compile of the reference (compiled here; ``bench_prepare`` warms its cache)."""
    if not torch.cuda.is_available():
        return StageResult(stage="bench", outcome=Outcome.INFRA_ERROR, reason="no CUDA GPU on this worker")
    return run_timing(ctx, with_compile=True)


@stage("bench_prepare")
def bench_prepare(ctx: Context) -> StageResult:
    """Compile the torch.compile baseline at every shape once, so the timed ``bench`` run finds it cached."""
    from ..bench.baselines import compiled_reference

    t0 = time.perf_counter()
    fn = compiled_reference(ctx.task)
    for point in ctx.shape_points():
        inputs = ctx.task.make_inputs(point.dims, ctx.seeds[0], device="cuda")
        with torch.no_grad():
            fn(**inputs, **ctx.task.constants)
        torch.cuda.synchronize()
    return StageResult(stage="bench_prepare", outcome=Outcome.PASSED, seconds=time.perf_counter() - t0, reason="")
