"""Verifier stages that run inside the worker process: each takes a :class:`Context`, returns a StageResult.

The registry :data:`STAGES` maps a stage name to its function; the GPU stages register themselves from
``coda_agent.verifier.gpu`` when that module is importable on the worker.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..primitives import backend
from ..tasks.loader import reference_function
from ..tasks.model import Task
from .candidate import CandidateModule, candidate_trace
from .compare import check_outputs
from .verdict import Outcome, OutputCheck, StageResult


@dataclass
class Context:
    """What every stage may use: the task, the candidate's source and module, and the job's settings."""

    task: Task
    source: str
    shape_set: str = "small"
    shape_names: list[str] | None = None
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    candidate_path: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="coda_candidate_")) / "candidate.py")
    _candidate: CandidateModule | None = None

    @property
    def candidate(self) -> CandidateModule:
        """The candidate, imported on first use (an import error propagates with the candidate's lines)."""
        if self._candidate is None:
            self._candidate = CandidateModule(self.source, self.candidate_path)
        return self._candidate

    def shape_points(self) -> list[Any]:
        points = self.task.shape(self.shape_set)
        if self.shape_names:
            points = [p for p in points if p.name in self.shape_names]
        return points


StageFn = Callable[[Context], StageResult]
STAGES: dict[str, StageFn] = {}


def stage(name: str) -> Callable[[StageFn], StageFn]:
    def register(fn: StageFn) -> StageFn:
        STAGES[name] = fn
        return fn

    return register


def upcast(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Floating inputs in FP32 (the FP32 reference's view of the same data); integer inputs unchanged."""
    return {k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()}


def clone(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in inputs.items()}


def references(task: Task, inputs: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(FP32 reference, task-dtype reference) on the same inputs."""
    ref = reference_function(task)
    with torch.no_grad():
        return ref(**upcast(inputs), **task.constants), ref(**clone(inputs), **task.constants)


def _call_candidate(ctx: Context, inputs: dict[str, torch.Tensor]) -> Any:
    return ctx.candidate.forward(**inputs, **ctx.task.constants)


@stage("correctness")
def cpu_correctness(ctx: Context) -> StageResult:
    """The emulator (torch backend) against the FP32 reference: every small shape, several seeds."""
    t0 = time.perf_counter()
    backend.set_backend("torch")
    checks: list[OutputCheck] = []
    try:
        ctx.candidate  # noqa: B018 - import now, so an import error is reported as such
    except Exception as exc:
        return StageResult(
            stage="correctness", outcome=Outcome.RUNTIME_ERROR,
            reason=f"importing the candidate failed:\n{candidate_trace(exc, ctx.candidate_path)}",
        )
    for point in ctx.shape_points():
        for seed in ctx.seeds:
            inputs = ctx.task.make_inputs(point.dims, seed)
            ref32, reflp = references(ctx.task, inputs)
            mine = clone(inputs)
            try:
                with torch.no_grad():
                    out = _call_candidate(ctx, mine)
            except Exception as exc:
                return StageResult(
                    stage="correctness", outcome=Outcome.RUNTIME_ERROR, seconds=time.perf_counter() - t0,
                    reason=f"forward() raised at shape {point.name} {point.dims}:\n{candidate_trace(exc, ctx.candidate_path)}",
                    checks=checks,
                )
            changed = [k for k in inputs if not torch.equal(inputs[k], mine[k])]
            if changed:
                return StageResult(
                    stage="correctness", outcome=Outcome.CHEAT_DETECTED, seconds=time.perf_counter() - t0,
                    reason=f"forward() modified its inputs {changed}; inputs are read-only", checks=checks,
                )
            checks.extend(check_outputs(ctx.task, out, ref32, reflp, point.dims, point.name, seed))
    failed = [c for c in checks if not c.ok]
    return StageResult(
        stage="correctness",
        outcome=Outcome.WRONG_OUTPUT if failed else Outcome.PASSED,
        reason=failed[0].reason if failed else f"all outputs within tolerance on {len(ctx.shape_points())} shapes x {len(ctx.seeds)} seeds",
        seconds=time.perf_counter() - t0,
        checks=checks,
    )


@stage("compile")
def compile_sm90(ctx: Context) -> StageResult:
    """Build every kernel forward() launches for sm_90a, without a GPU (QuACK compile-only)."""
    t0 = time.perf_counter()
    backend.set_backend("quack-compile")
    point = ctx.shape_points()[0]
    inputs = ctx.task.make_inputs(point.dims, 0)
    try:
        with torch.no_grad():
            _call_candidate(ctx, inputs)
    except Exception as exc:
        return StageResult(
            stage="compile", outcome=Outcome.COMPILE_ERROR, seconds=time.perf_counter() - t0,
            reason=f"building the sm_90a kernels failed at shape {point.name}:\n{candidate_trace(exc, ctx.candidate_path)}",
        )
    finally:
        backend.set_backend("torch")
    return StageResult(
        stage="compile", outcome=Outcome.PASSED, seconds=time.perf_counter() - t0,
        reason=f"compiled every kernel for sm_90a at shape {point.name}",
    )
