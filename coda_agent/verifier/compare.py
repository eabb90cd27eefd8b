"""The tolerance rule: a candidate may be at most ``factor`` times as wrong as a low-precision baseline.

For each output: err = max|cand - ref_fp32|, lowp = max|baseline - ref_fp32|, and the candidate passes when
err <= factor * lowp + floor * max(1, max|ref_fp32|). A floating-point output must also pass the same rule on
the L1 and L2 norms of the error (||cand - ref||_p <= factor * ||baseline - ref||_p + floor * ||max(1,
|ref|)||_p): the max rule alone is set by an output's largest elements, so it would let most of the small ones
be dropped or approximated (a softmax gradient's tail, an activation's small values, a statistic's small
rows). NaN or Inf in the candidate always fails. The baseline is the task's choice (``tolerance.baseline``,
which a plan may override): the reference run on the task-dtype inputs (``eager``), or the FP32 reference
rounded once to the output's dtype (``single_rounding``, CODA's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..tasks.model import Baseline, Task, torch_dtype
from .plan import CHUNK_ELEMENTS
from .verdict import OutputCheck

#: How a reason names each baseline.
BASELINE_TEXT = {"eager": "task-dtype reference error", "single_rounding": "single-rounding reference error"}


def chunk_spans(shape: tuple[int, ...], elements: int | None = None) -> list[tuple[int, int]]:
    """Flat [start, end) spans covering a tensor of ``shape``: whole rows (dim 0) of at most ``elements``
    together, or ``elements`` at a time when one row is larger (default :data:`~.plan.CHUNK_ELEMENTS`)."""
    elements = elements or CHUNK_ELEMENTS
    n = math.prod(shape)
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    step = max(1, elements // row) * row if 0 < row <= elements else elements
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _piece(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Elements [start, end) of ``t`` in row-major order, flat; a view of a contiguous tensor or of whole
    rows."""
    if t.is_contiguous() or t.dim() == 0:
        return t.reshape(-1)[start:end]
    row = math.prod(t.shape[1:])
    if row and start % row == 0 and (end % row == 0 or end == t.numel()):
        return t[start // row : -(-end // row)].reshape(-1)
    # a copy of all of t: only a non-contiguous output whose rows exceed a chunk
    return t.reshape(-1)[start:end]


def _f64(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fresh FP64 copy on ``device`` (fresh: the caller works on it in place)."""
    return t.to(device=device, dtype=torch.float64, copy=True)


@dataclass(frozen=True)
class ErrorStats:
    """What the tolerance rule reads of one output, gathered chunk by chunk: the candidate's non-finite
    elements (count, first flat index), max|cand - ref| and its first flat index, max|baseline - ref|,
    max|ref|, the L1 and L2 norms of the error, of the baseline's error and of max(1, |ref|), and the sums
    cand·ref, cand·cand and ref·ref (a least-squares factor between them, :meth:`factor`); of a 2-D output,
    max|cand - ref| of each row and of each column (where the failing elements lie); the elements where both
    references are exactly 0, and how many of those the candidate is not (first flat index)."""

    nonfinite: int
    first_nonfinite: int
    max_err: float
    max_err_at: int
    lowp_err: float
    ref_max: float
    err_norms: tuple[float, float]
    lowp_norms: tuple[float, float]
    scale_norms: tuple[float, float]
    products: tuple[float, float, float] = (0.0, 0.0, 0.0)
    zeros: int = 0
    zeros_missed: int = 0
    first_zero_missed: int = 0
    #: elements not equal to the reference's, the candidate's and the baseline's (an integer output's rule)
    mismatches: tuple[int, int] = (0, 0)
    #: on the device, read only where a check fails (:func:`failing_block`)
    row_max: torch.Tensor | None = None
    col_max: torch.Tensor | None = None

    def factor(self) -> float | None:
        """s where cand is s x ref throughout (within 1% of its norm) and s is not 1: a dropped or extra
        scale, a mean for a sum, which a ratio to the tolerance reads as any wrong formula."""
        cr, cc, rr = self.products
        if not (math.isfinite(cr) and math.isfinite(cc) and rr > 0 and cc > 0):
            return None
        s = cr / rr
        residual = max(cc / rr - s * s, 0.0)  # |cand - s ref|^2 / |ref|^2
        return s if math.sqrt(residual) <= 0.01 * abs(s) and abs(s - 1.0) > 0.02 else None


def error_stats(cand: torch.Tensor, ref32: torch.Tensor, lowp: Callable[[int, int], torch.Tensor],
                elements: int | None = None, zero_floor: float = 0.0) -> ErrorStats:
    """One pass over ``cand`` and ``ref32`` (same shape), ``elements`` at a time, in FP64 on ``cand``'s
    device; ``lowp(start, end)`` gives the baseline's flat elements [start, end); a candidate's element
    counts as not 0 past ``zero_floor``. No step holds more than
    :data:`~.plan.CHUNK_BUFFERS` FP64 chunks, and nothing is read back to the host until the end (one
    transfer).

    The same numbers as on whole tensors: maxima are exact whatever the grouping, an index is the first one at
    the maximum (torch's argmax: NaN counts as the largest), and the sums only group their terms otherwise."""
    device = cand.device
    bad: list[torch.Tensor] = []
    peaks: list[torch.Tensor] = []  # per chunk: max err, its index in the chunk, max lowp err, max |ref|
    sums: list[torch.Tensor] = []  # per chunk: L1, squared L2 of err, lowp err, scale; the products; zeros
    spans = chunk_spans(tuple(cand.shape), elements)
    # a 2-D output's chunks are whole rows (its rows are far below a chunk): each row's and column's max error
    whole_rows = cand.dim() == 2 and cand.shape[1] and all(b % cand.shape[1] == 0 or b == cand.numel()
                                                           for _, b in spans)
    width = int(cand.shape[1]) if whole_rows else 0
    rows: list[torch.Tensor] = []
    cols: torch.Tensor | None = None
    for start, end in spans:
        c = _f64(_piece(cand, start, end), device)
        bad.append((~torch.isfinite(c)).sum())
        r = _f64(_piece(ref32, start, end), device)
        products = [torch.dot(c, r), torch.dot(c, c), torch.dot(r, r)]
        zero = r == 0
        d = c.sub_(r).abs_()
        if width:
            grid = d.view(-1, width)
            rows.append(grid.amax(1))
            cols = grid.amax(0) if cols is None else torch.maximum(cols, grid.amax(0))
        at = d.argmax()
        peak = [d.max(), at.to(torch.float64)]
        part = [d.sum(), torch.dot(d, d)]
        missed = zero & (d > zero_floor)  # where ref is 0, d is |cand|
        counted = [(d != 0).sum()]
        del c, d
        ld = _f64(lowp(start, end), device).sub_(r).abs_()
        peak.append(ld.max())
        part += [ld.sum(), torch.dot(ld, ld)]
        zero &= ld == 0
        missed &= zero
        counted.append((ld != 0).sum())
        zeros = [t.to(torch.float64) for t in (zero.sum(), missed.sum(), *counted)]
        del ld, zero, missed
        s = r.abs_()
        peak.append(s.max())
        s = s.clamp_min_(1.0)
        part += [s.sum(), torch.dot(s, s), *products, *zeros]
        del r, s
        peaks.append(torch.stack(peak))
        sums.append(torch.stack(part))
    if not spans:
        return ErrorStats(0, 0, 0.0, 0, 0.0, float("nan"), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0))
    counts = torch.stack(bad).tolist()
    table = torch.stack(peaks)
    chunk = int(table[:, 0].argmax())  # the first chunk at the largest error holds its first index
    maxima = table.amax(dim=0).tolist()  # NaN propagates, as in a whole tensor's max
    per_chunk = torch.stack(sums)
    total = per_chunk.sum(dim=0).tolist()
    first_bad = 0
    for (start, end), n in zip(spans, counts, strict=True):
        if n:
            first_bad = start + int((~torch.isfinite(_piece(cand, start, end))).nonzero()[0])
            break
    first_missed = 0
    for (start, end), n in zip(spans, per_chunk[:, 10].tolist() if total[10] else [], strict=False):
        if n:
            r = _f64(_piece(ref32, start, end), device)
            missed = ((r == 0) & (_f64(lowp(start, end), device) == 0)
                      & (_f64(_piece(cand, start, end), device).abs_() > zero_floor))
            first_missed = start + int(missed.nonzero()[0])
            break
    return ErrorStats(
        nonfinite=int(sum(counts)), first_nonfinite=first_bad,
        max_err=float(table[chunk, 0]), max_err_at=spans[chunk][0] + int(table[chunk, 1]),
        lowp_err=maxima[2], ref_max=maxima[3],
        err_norms=(total[0], math.sqrt(total[1])), lowp_norms=(total[2], math.sqrt(total[3])),
        scale_norms=(total[4], math.sqrt(total[5])), products=(total[6], total[7], total[8]),
        zeros=int(total[9]), zeros_missed=int(total[10]), first_zero_missed=first_missed,
        mismatches=(int(total[11]), int(total[12])),
        row_max=torch.cat(rows) if width else None, col_max=cols,
    )


def max_abs_difference(a: torch.Tensor, b: torch.Tensor, elements: int | None = None) -> float:
    """max|a - b| in FP64 over same-shaped tensors, chunk by chunk; a NaN difference counts as Inf."""
    worst: list[torch.Tensor] = []
    for start, end in chunk_spans(tuple(a.shape), elements):
        d = _f64(_piece(a, start, end),
                 a.device).sub_(_piece(b, start, end).to(a.device, torch.float64)).abs_()
        worst.append(d.nan_to_num_(nan=math.inf, posinf=math.inf).max())
        del d
    return float(torch.stack(worst).max()) if worst else 0.0


def _spread_error(stats: ErrorStats, factor: float, floor: float) -> str | None:
    """What is wrong with the error's L1 or L2 norm against the baseline's, or None when both are within
    bounds. The floor scales with max(1, |ref|) element by element, as the max rule's does with max(1,
    max|ref|)."""
    for i, p in enumerate((1, 2)):
        err = stats.err_norms[i]
        allowed = factor * stats.lowp_norms[i] + floor * stats.scale_norms[i]
        if err > allowed:
            return f"the L{p} norm of the error, {err:.4g}, exceeds the allowed {allowed:.4g}"
    return None


#: Elements both references hold exactly 0 are structure (a ReLU, a clamp, a mask), not rounding: a kernel
#: computing the same function misses them only where its value crosses the boundary, a tiny share of them
#: (a leaky ReLU squared with slope 0.03 stayed within the max and norm rules, 0 at none of half its output).
ZEROS_MISSED = 0.1
#: Fewer such zeros than this are left to the other rules (values that happen to be 0 are not structure).
MIN_ZEROS = 64


def _zeros_error(stats: ErrorStats, floor: float, shape: tuple[int, ...], cand: torch.Tensor) -> str | None:
    """What is wrong where both references are exactly 0, or None: the candidate is not 0 there (past the
    floor) at more than :data:`ZEROS_MISSED` of them."""
    if stats.zeros < MIN_ZEROS or stats.zeros_missed <= ZEROS_MISSED * stats.zeros:
        return None
    at = _unravel(stats.first_zero_missed, shape)
    return (f"both references are exactly 0 at {stats.zeros} elements and it is not (|value| > the floor "
            f"{floor:g}) at {stats.zeros_missed} of them, first at {at} (got {float(cand[tuple(at)]):.6g}): "
            "where the reference's function is 0 (a ReLU, a clamp, a mask) this one is not (a leaky slope, a "
            "dropped mask)")


def _mismatch_error(stats: ErrorStats, factor: float, floor: float, numel: int) -> str | None:
    """What is wrong with an integer output (an argmax, a mask) beyond its largest error, or None: it may
    differ from the FP32 reference only about as often as the baseline does (where rounding decides it, a
    near tie), ``factor`` times as often plus the floor's share; its largest error alone let an argmax 100
    places off through, and a mask of ones where 5% should be 0."""
    wrong, baseline = stats.mismatches
    allowed = factor * baseline + floor * numel
    if wrong <= allowed:
        return None
    return (f"it differs from the FP32 reference at {wrong} of {numel} elements, where the "
            f"baseline differs at {baseline} (rounding deciding a near tie); {factor:g} x that is allowed")


def _ranges(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted indices as runs of consecutive ones, (first, last)."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


#: The most runs of rows or of columns a reason names (more read as scattered: counted where they are few).
MAX_RUNS = 3
#: Scattered rows or columns are counted where at most this share of them holds every error past the
#: tolerance (a manual seat's kernel without eps failed at 13 planted tiny rows of 256, named by one element).
FEW = 0.1


def failing_block(stats: ErrorStats, allowed: float) -> str:
    """Where a 2-D output's errors past ``allowed`` lie, where that is part of its rows or of its columns in
    at most :data:`MAX_RUNS` runs ("; they lie in rows 192-199 of 200"): a wrong block of columns (one head,
    the V part) or a partial last tile's rows, which the worst element alone does not say; or, scattered, a
    few rows or columns of their own (counted, the first three named)."""
    parts = []
    for axis, maxima in (("rows", stats.row_max), ("columns", stats.col_max)):
        if maxima is None:
            continue
        off = (maxima > allowed).nonzero().flatten().tolist()
        runs = _ranges(off)
        if off and len(off) < len(maxima) and len(runs) <= MAX_RUNS:
            named = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
            parts.append(f"{axis} {named} of {len(maxima)}")
        elif off and len(off) <= len(maxima) * FEW:  # a few rows of their own (an eps's tiny rows), scattered
            first = ", ".join(map(str, off[:3]))
            parts.append(f"{len(off)} scattered {axis} of {len(maxima)} ({first}, ...)")
    return f"; every element off by more than that is in {' and '.join(parts)}" if parts else ""


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
    """Check every declared output against ``baseline`` (default: the task's); a failing check's reason says
    what to fix."""
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
            instead = (
                f" (it returned {', '.join(map(repr, others))}, which the task does not declare)"
                if others
                else ""
            )
            checks.append(OutputCheck(**base, ok=False, reason=f"output {spec.name!r} is missing from "
                                                               f"forward()'s dict{instead}"))
            continue
        if not isinstance(got, torch.Tensor) or type(got) is not torch.Tensor:
            checks.append(OutputCheck(**base, ok=False, reason=f"output {spec.name!r} must be a plain "
                                                               f"torch.Tensor, got {type(got).__name__}"))
            continue
        if tuple(got.shape) != want_shape:
            checks.append(OutputCheck(**base, ok=False, reason=f"output {spec.name!r} has shape "
                                                               f"{tuple(got.shape)}, expected {want_shape}"))
            continue
        if got.dtype != want_dtype:
            checks.append(OutputCheck(**base, ok=False, reason=(
                f"output {spec.name!r} has dtype {got.dtype}, expected {want_dtype} (gemm() stores D and its "
                "extra outputs in its out_dtype; a host op's result follows torch's type promotion, a "
                f"{want_dtype} tensor with an FP32 one giving FP32, so pass that op out= a {want_dtype} "
                "tensor; a separate cast is one more launch)")))
            continue
        # FP64 on the candidate's device, a chunk at a time (:func:`error_stats`): bench-size outputs are
        # compared on the GPU in milliseconds, with temporaries of a few chunks whatever the output's size.
        cand = got.detach()
        ref32 = ref_fp32[spec.name].detach()
        lowp_src = ref_lowp[spec.name].detach() if rule != "single_rounding" else None

        def lowp(start: int, end: int, ref32: torch.Tensor = ref32, src: torch.Tensor | None = lowp_src,
                 dtype: torch.dtype = want_dtype) -> torch.Tensor:
            return _piece(ref32, start, end).to(dtype) if src is None else _piece(src, start, end)

        factor, floor = task.tolerance.for_output(spec.name)
        stats = error_stats(cand, ref32, lowp, zero_floor=floor)
        if stats.nonfinite:
            first = _unravel(stats.first_nonfinite, want_shape)
            checks.append(
                OutputCheck(
                    **base, ok=False, worst_index=first,
                    reason=f"output {spec.name!r} has {stats.nonfinite} NaN/Inf values (first at {first}); "
                    "an unwritten element, an overflow or 0 x inf (a mask multiplying -inf)",
                )
            )
            continue
        err, flat, lowp_err = stats.max_err, stats.max_err_at, stats.lowp_err
        allowed = task.tolerance.allowed(spec.name, lowp_err, stats.ref_max if cand.numel() else 0.0)
        where = _unravel(flat, want_shape)
        if math.isinf(allowed):
            # a baseline that overflows only at this shape (validate runs the small ones): an infinite
            # allowance would pass any output (a NaN one passes nothing already)
            checks.append(OutputCheck(
                **base, ok=False, max_abs_err=err, allowed=allowed, lowp_err=lowp_err, baseline=rule,
                reason=f"output {spec.name!r}: the task's {BASELINE_TEXT[rule]} is {lowp_err:g} here, so "
                       "the tolerance is not finite and no output can be judged: the task's reference "
                       "overflows in its dtype at this shape (compute it stably)"))
            continue
        ok = err <= allowed
        spread = _spread_error(stats, factor, floor) if ok and want_dtype.is_floating_point else None
        zeros = (_zeros_error(stats, floor, want_shape, cand) if want_dtype.is_floating_point
                 else _mismatch_error(stats, factor, floor, cand.numel())) if ok else None
        if zeros is not None:
            checks.append(OutputCheck(
                **base, ok=False, max_abs_err=err, allowed=allowed, lowp_err=lowp_err, baseline=rule,
                worst_index=_unravel(stats.first_zero_missed, want_shape),
                reason=f"output {spec.name!r}: {zeros}",
            ))
            continue
        if spread is not None:
            checks.append(OutputCheck(
                **base, ok=False, max_abs_err=err, allowed=allowed, lowp_err=lowp_err, baseline=rule,
                worst_index=where, reason=f"output {spec.name!r}: {spread} ({factor:g} x the "
                                          f"{BASELINE_TEXT[rule]}'s + floor): many "
                       "elements are off by less than the largest error allowed (a dropped term or an "
                       "approximation)",
            ))
            continue
        got_at = float(cand[tuple(where)]) if cand.numel() else None
        want_at = float(ref32[tuple(where)]) if cand.numel() else None
        rounded = (rounded_to(got_at, want_at) if not ok and got_at is not None and want_at is not None
                   and want_dtype.itemsize > 2 else None)
        times = None if ok or rounded else stats.factor()
        checks.append(
            OutputCheck(
                **base, ok=ok, max_abs_err=err, allowed=allowed, lowp_err=lowp_err, baseline=rule,
                # no worst element where every element is exact (a table read "worst at [0]")
                worst_index=where if err else None, worst_value=got_at if err else None,
                expected_value=want_at if err else None, rounded_to=rounded, factor=times,
                reason="" if ok else (
                    f"output {spec.name!r}: max error {err:.3g} at {where} (got {got_at:.6g}, "
                    f"expected {want_at:.6g}) exceeds the allowed {allowed:.3g} "
                    f"({factor:g} x {BASELINE_TEXT[rule]} {lowp_err:.3g} + floor)"
                    + (f"; got is expected rounded to {rounded}" if rounded else "")
                    + (f"; got is {times:.4g} x expected throughout" if times else "")
                    + ("" if rounded or times else failing_block(stats, allowed))
                ),
            )
        )
    extra = set(candidate) - {o.name for o in task.outputs}
    if extra:
        checks.append(
            OutputCheck(output=",".join(sorted(extra)), shape_point=shape_point, seed=seed, ok=False,
                        reason="forward() returned names that are not task outputs: "
                               f"{', '.join(sorted(extra))}")
        )
    return checks


#: Significand bits (the implicit one not counted) of the 16-bit dtypes an FP32 value may have been
#: rounded to.
SIGNIFICAND_BITS = {"bfloat16": 7, "float16": 10}


def rounded_to(got: float, expected: float) -> str | None:
    """The 16-bit dtype ``got`` is ``expected`` rounded to (it is a value of that dtype, at most half a step
    of it from ``expected``), or None: an FP32 output whose worst error is that rounding was rounded on its
    way (its formula is right), which no ratio to the tolerance says."""
    if not (math.isfinite(got) and math.isfinite(expected)) or got == expected or expected == 0.0:
        return None
    for name, bits in SIGNIFICAND_BITS.items():
        dtype = getattr(torch, name)
        if float(torch.tensor(got).to(dtype)) != got:
            continue
        step = 2.0 ** (math.floor(math.log2(abs(expected))) - bits)
        if abs(got - expected) <= step / 2:
            return name
    return None

