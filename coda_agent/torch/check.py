"""A CODA stack's gradients against FP32 autograd, by the suite's tolerance rule: what the chain's tests and
the end-to-end bench hold the kernels in a model to.

Each gradient (every parameter's, and the input's as ``h``) is judged as a task's output is: its max-abs
error against the FP32 reference may be ``factor`` times that of the same model run eagerly at the stack's
dtype, plus ``floor`` times its scale (``tasks.model.Tolerance``, with the chain's tasks' one rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..tasks import find_task
from .layer import CodaLlamaStack
from .ops import CHAIN_TASKS
from .reference import ReferenceLlamaStack

#: The gradient of the stack's input, beside its parameters'.
INPUT = "h"


@dataclass(frozen=True)
class GradientError:
    """One gradient's max-abs error against FP32 autograd, and what the tolerance rule allows it."""

    name: str
    error: float
    allowed: float

    @property
    def ratio(self) -> float:
        """error / allowed: at most 1 passes (NaN fails)."""
        return self.error / self.allowed if self.allowed > 0 else float("inf")

    @property
    def passed(self) -> bool:
        return self.error <= self.allowed


def loss_and_gradients(model: nn.Module, h: torch.Tensor, targets: torch.Tensor,
                       run: Callable[..., torch.Tensor] | None = None,
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward and backward of ``model`` (through ``run``, e.g. it compiled, if given) on a copy of ``h``
    in the model's dtype: the loss, and the gradient of every parameter and of the input (:data:`INPUT`)."""
    model.zero_grad(set_to_none=True)
    dtype = next(model.parameters()).dtype
    x = h.detach().to(dtype).clone().requires_grad_()
    loss = (model if run is None else run)(x, targets)
    loss.backward()
    assert x.grad is not None
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), {**grads, INPUT: x.grad}


def chain_tolerance() -> tuple[float, float]:
    """(factor, floor) of the rule every task of the chain uses; a task that changes its rule changes this
    check, and one that differs from the others is refused here rather than silently averaged."""
    rules = {(t.tolerance.factor, t.tolerance.floor) for t in map(find_task, CHAIN_TASKS)}
    if len(rules) != 1:
        raise ValueError(f"the chain's tasks differ in their tolerance rule ({sorted(rules)}): pick one per "
                         "gradient")
    (rule,) = rules
    return rule


def gradient_errors(got: dict[str, torch.Tensor], truth: dict[str, torch.Tensor],
                    eager: dict[str, torch.Tensor]) -> list[GradientError]:
    """Each of ``truth``'s gradients in ``got`` judged by the rule, with ``eager``'s error as the baseline."""
    factor, floor = chain_tolerance()

    def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).abs().max())

    return [GradientError(name, max_error(got[name], want),
                          factor * max_error(eager[name], want) + floor * max(1.0, float(want.abs().max())))
            for name, want in truth.items()]


def check_gradients(stack: CodaLlamaStack, h: torch.Tensor, targets: torch.Tensor,
                    run: Callable[..., torch.Tensor] | None = None) -> list[GradientError]:
    """``stack``'s gradients (through ``run`` if given) at this batch against the same model in plain PyTorch:
    FP32 for the truth, the stack's dtype for the baseline. The references are built and dropped one at a
    time, so the check needs the FP32 model's memory once."""
    _, got = loss_and_gradients(stack, h, targets, run)
    got = {name: g.detach().clone() for name, g in got.items()}
    stack.zero_grad(set_to_none=True)
    reference = ReferenceLlamaStack.like(stack, torch.float32)
    _, truth = loss_and_gradients(reference, h, targets)
    del reference
    reference = ReferenceLlamaStack.like(stack)
    _, eager = loss_and_gradients(reference, h, targets)
    del reference
    return gradient_errors(got, truth, eager)
