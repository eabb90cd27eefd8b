"""The tolerance rule: a candidate may be at most ``factor`` times as wrong as a low-precision baseline.

For each output: err = max|cand - ref_fp32|, lowp = max|baseline - ref_fp32|, and the candidate passes when
err <= factor * lowp + floor * max(1, max|ref_fp32|). A floating-point output must also pass the same rule on the
L1 and L2 norms of the error (||cand - ref||_p <= factor * ||baseline - ref||_p + floor * ||max(1, |ref|)||_p): the
max rule alone is set by an output's largest elements, so it would let most of the small ones be dropped or
approximated (a softmax gradient's tail, an activation's small values, a statistic's small rows). NaN or Inf in
the candidate always fails. The baseline is the task's choice (``tolerance.baseline``, which a plan may
override): the reference run on the task-dtype inputs (``eager``), or the FP32 reference rounded once to the
output's dtype (``single_rounding``, CODA's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..tasks.model import Baseline, Task, torch_dtype
from .verdict import OutputCheck

#: How a reason names each baseline.
BASELINE_TEXT = {"eager": "task-dtype reference error", "single_rounding": "single-rounding reference error"}


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    diff = (a.double() - b.double()).abs().reshape(-1)
    idx = int(diff.argmax()) if diff.numel() else 0
    return (float(diff[idx]) if diff.numel() else 0.0), idx




def _spread_error(cand: torch.Tensor, ref: torch.Tensor, lowp: torch.Tensor, factor: float, floor: float) -> str | None:
    """What is wrong with the error's L1 or L2 norm against the baseline's, or None when both are within bounds.
    The floor scales with max(1, |ref|) element by element, as the max rule's does with max(1, max|ref|)."""
    scale = ref.abs().clamp_min(1.0)
    for p in (1, 2):
        err = float(torch.linalg.vector_norm(cand - ref, p))
        allowed = factor * float(torch.linalg.vector_norm(lowp - ref, p)) + floor * float(torch.linalg.vector_norm(scale, p))
        if err > allowed:
            return f"the L{p} norm of the error, {err:.4g}, exceeds the allowed {allowed:.4g}"
    return None


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for d in reversed(shape):
        out.append(flat % d if d else 0)
        flat = flat // d if d else 0
    return list(reversed(out))


def check_outputs(
    task: Task,
    candidate: Mapping[str, object],
    ref_fp32: Mapping[str, torch.Tensor],
    ref_lowp: Mapping[str, torch.Tensor],
    dims: dict[str, int],
    shape_point: str,
    seed: int,
    baseline: Baseline | None = None,
) -> list[OutputCheck]:
    """Check every declared output against ``baseline`` (default: the task's); a failing check's reason says what to fix."""
    rule = baseline or task.tolerance.baseline
    checks: list[OutputCheck] = []
    if not isinstance(candidate, Mapping):
        return [
            OutputCheck(
                output=o.name, shape_point=shape_point, seed=seed, ok=False,
                reason=f"forward() must return a dict keyed by output name, got {type(candidate).__name__}",
            )
            for o in task.outputs
        ]
    for spec in task.outputs:
        base: dict[str, Any] = {"output": spec.name, "shape_point": shape_point, "seed": seed}
        want_shape = spec.concrete_shape(dims)
        want_dtype = torch_dtype(spec.dtype)
        got = candidate.get(spec.name)
        if got is None:
            others = sorted(str(k) for k in candidate if k not in {o.name for o in task.outputs})
            instead = f" (it returned {', '.join(map(repr, others))}, which the task does not declare)" if others else ""
            checks.append(OutputCheck(**base, ok=False, reason=f"output {spec.name!r} is missing from forward()'s dict{instead}"))
            continue
        if not isinstance(got, torch.Tensor) or type(got) is not torch.Tensor:
            checks.append(OutputCheck(**base, ok=False, reason=f"output {spec.name!r} must be a plain torch.Tensor, got {type(got).__name__}"))
            continue
        if tuple(got.shape) != want_shape:
            checks.append(OutputCheck(**base, ok=False, reason=f"output {spec.name!r} has shape {tuple(got.shape)}, expected {want_shape}"))
            continue
        if got.dtype != want_dtype:
            checks.append(OutputCheck(**base, ok=False, reason=f"output {spec.name!r} has dtype {got.dtype}, expected {want_dtype}"))
            continue
        # FP64 on the candidate's device: bench-size outputs are compared on the GPU in milliseconds.
        cand = got.detach().double()
        ref32 = ref_fp32[spec.name].detach().to(cand.device)
        ref = ref32.double()
        lowp = (ref32.to(want_dtype) if rule == "single_rounding" else ref_lowp[spec.name].detach().to(cand.device)).double()
        bad = ~torch.isfinite(cand)
        if bool(bad.any()):
            first = _unravel(int(bad.reshape(-1).nonzero()[0]), want_shape)
            checks.append(
                OutputCheck(
                    **base, ok=False, worst_index=first,
                    reason=f"output {spec.name!r} has {int(bad.sum())} NaN/Inf values (first at {first}); "
                    "an unwritten element or an overflow",
                )
            )
            continue
        err, flat = _max_abs(cand, ref)
        lowp_err, _ = _max_abs(lowp, ref)
        factor, floor = task.tolerance.for_output(spec.name)
        scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
        allowed = factor * lowp_err + floor * scale
        where = _unravel(flat, want_shape)
        ok = err <= allowed
        spread = _spread_error(cand, ref, lowp, factor, floor) if ok and want_dtype.is_floating_point else None
        if spread is not None:
            checks.append(OutputCheck(
                **base, ok=False, max_abs_err=err, allowed=allowed, lowp_err=lowp_err, baseline=rule, worst_index=where,
                reason=f"output {spec.name!r}: {spread} ({factor:g} x the {BASELINE_TEXT[rule]}'s + floor): many "
                       "elements are off by less than the largest error allowed (a dropped term or an approximation)",
            ))
            continue
        checks.append(
            OutputCheck(
                **base, ok=ok, max_abs_err=err, allowed=allowed, lowp_err=lowp_err, baseline=rule, worst_index=where,
                worst_value=float(cand.reshape(-1)[flat]), expected_value=float(ref.reshape(-1)[flat]),
                reason="" if ok else (
                    f"output {spec.name!r}: max error {err:.3g} at {where} (got {float(cand.reshape(-1)[flat]):.6g}, "
                    f"expected {float(ref.reshape(-1)[flat]):.6g}) exceeds the allowed {allowed:.3g} "
                    f"({factor:g} x {BASELINE_TEXT[rule]} {lowp_err:.3g} + floor)"
                ),
            )
        )
    extra = set(candidate) - {o.name for o in task.outputs}
    if extra:
        checks.append(
            OutputCheck(output=",".join(sorted(extra)), shape_point=shape_point, seed=seed, ok=False,
                        reason=f"forward() returned names that are not task outputs: {sorted(extra)}")
        )
    return checks
