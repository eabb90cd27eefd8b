"""The terms of a reference's sums that its test data lets a kernel leave out.

A kernel is judged by its outputs at the test data, within the task's tolerance. A term the data makes too
small to see (label smoothing's mean over the vocabulary, which zero-mean weights bring to about zero) passes
the check whether a kernel computes it or not. :func:`invisible_terms` drops each tensor term of each sum the
FP32 reference computes, in turn (a TorchDispatchMode replaces it by zeros), and names the ones whose absence
moves no output past twice the tolerance at any small shape (:data:`SEEN`). Scalars (an ``eps``) are the
constants' check's (:mod:`.validate`).
"""

from __future__ import annotations

import linecache
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .loader import reference_function, upcast
from .model import Task, torch_dtype

Tensors = dict[str, torch.Tensor]
#: How far past the tolerance a dropped term must move some output to count as seen: a kernel's own rounding,
#: up to the tolerance, can offset a missing term's effect by as much, so only a move past twice the tolerance
#: fails it for sure.
SEEN = 2.0
#: The sums whose tensor operands are terms: dropping one is what a kernel that leaves the term out computes.
_SUMS = {torch.ops.aten.add.Tensor: "+", torch.ops.aten.sub.Tensor: "-"}


@dataclass(frozen=True)
class Term:
    """One operand of one sum the reference computes: the sum's place in the run (its index among the sums),
    which operand (0: left, 1: right), the reference's line that made it, and the largest magnitude of the
    term and of the other operand at the first small shape (which of a line's sums it is, where it has
    several)."""

    index: int
    operand: int
    sign: str
    line: int
    text: str
    size: float = 0.0
    other: float = 0.0
    #: The sum itself where the line holds more (Python's instruction positions), else "".
    expression: str = ""

    def describe(self, reference: Path) -> str:
        side = "left" if self.operand == 0 else "right"
        where = f"`{self.expression}` in `{self.text}`" if self.expression else f"`{self.text}`"
        return (f"{reference.name}:{self.line}: the {side} term of the '{self.sign}' in {where} (at most "
                f"{self.size:.2g} in magnitude, beside {self.other:.2g})")


class _Sums(TorchDispatchMode):
    """Records the reference's sums of floating tensors (with the reference's line that made each); with
    ``drop``, computes that one term as zeros."""

    def __init__(self, reference: Path, drop: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.reference, self.drop = str(reference.resolve()), drop
        self.terms: list[Term] = []
        self._count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _SUMS and len(args) >= 2 and all(_is_term(a) for a in args[:2]):
            index, self._count = self._count, self._count + 1
            if self.drop is None:
                line, text, expression = self._where()
                sizes = [float(a.abs().max()) for a in args[:2]]
                self.terms += [Term(index, j, _SUMS[func], line, text, sizes[j], sizes[1 - j], expression)
                               for j in (0, 1)]
            elif self.drop[0] == index:
                args = list(args)
                args[self.drop[1]] = torch.zeros_like(args[self.drop[1]])
        return func(*args, **kwargs)

    def _where(self) -> tuple[int, str, str]:
        """The innermost line of the reference file on the stack (the reference's own line, or its call into
        torch), and the expression on it that made the sum where it is only part of the line."""
        frame: FrameType | None = sys._getframe()
        while frame is not None and frame.f_code.co_filename != self.reference:
            frame = frame.f_back
        if frame is None:
            return 0, "", ""
        # the instruction the frame is at: its line and columns (the sum's own expression, or the call in it)
        line, end_line, start, end = list(frame.f_code.co_positions())[frame.f_lasti // 2]
        source = linecache.getline(self.reference, line or frame.f_lineno)
        text = source.strip()
        expression = source[start:end].strip() if None not in (start, end) and end_line == line else ""
        return line or frame.f_lineno, text, "" if expression == text else expression


def _is_term(x: object) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1


def invisible_terms(task: Task, runs: Sequence[tuple[Tensors, Tensors, Tensors]]) -> list[Term]:
    """The terms (:class:`Term`) that, dropped, move no output past the task's tolerance at any of ``runs``:
    each a small shape's (inputs, FP32 reference outputs, the tolerance baseline's outputs)."""
    ref_fn = reference_function(task)
    first_inputs = runs[0][0]
    with torch.no_grad(), _Sums(task.reference_file) as probe:
        ref_fn(**upcast(first_inputs), **task.constants)
    seen: set[tuple[int, str, int]] = set()
    sums_on: dict[int, set[str]] = {}  # line -> its sums' expressions
    for term in probe.terms:
        sums_on.setdefault(term.line, set()).add(term.expression)
    hidden = []
    for term in probe.terms:
        key = (term.line, term.expression, term.operand)
        if key in seen and term.line:
            continue  # one verdict per source term (a loop's sums are the same term)
        seen.add(key)
        if all(within_tolerance(task, ref, base, dropped_term(task, inputs, term))
               for inputs, ref, base in runs):
            # the sum's own expression only where the line holds several (which of them it is)
            hidden.append(term if len(sums_on[term.line]) > 1 else replace(term, expression=""))
    return hidden


def dropped_term(task: Task, inputs: Tensors, term: Term) -> Tensors | None:
    """The FP32 reference with ``term`` computed as zeros; None when it does not run so (a shape that no
    longer broadcasts, an error): then the term is not invisible."""
    try:
        with torch.no_grad(), _Sums(task.reference_file, drop=(term.index, term.operand)):
            out = reference_function(task)(**upcast(inputs), **task.constants)
    except Exception:  # any error the changed value leads to counts as the term being seen
        return None
    return out if isinstance(out, dict) else None


def within_tolerance(task: Task, ref: Tensors, base: Tensors, got: Tensors | None) -> bool:
    """Every output of ``got`` within :data:`SEEN` times the task's tolerance of ``ref`` (``base``: the
    baseline's outputs)."""
    if got is None:
        return False
    for spec in task.outputs:
        if spec.name not in got or not torch_dtype(spec.dtype).is_floating_point:
            if spec.name in got and not torch.equal(got[spec.name], ref[spec.name]):
                return False
            continue
        r, g = ref[spec.name].double(), got[spec.name].double()
        if g.shape != r.shape or not bool(torch.isfinite(g).all()):
            return False
        baseline_err = float((base[spec.name].double() - r).abs().max()) if r.numel() else 0.0
        ref_max = float(r.abs().max()) if r.numel() else 0.0
        if float((g - r).abs().max()) > SEEN * task.tolerance.allowed(spec.name, baseline_err, ref_max):
            return False
    return True
