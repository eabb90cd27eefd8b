"""Declarations a candidate attaches to an epilogue: operand pins and reduction sinks.

They mirror QuACK's op names (``ColVecLoad``, ``ColVecReduce`` …) so that code written against
``quack.epilogue`` reads the same here, but they are plain frozen dataclasses: the torch emulator
interprets them directly and the quack backend translates them into ``quack.epilogue.ops`` objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Combine = Literal["add", "max", "max_abs"]


@dataclass(frozen=True)
class ColVecLoad:
    """Pin an operand as a per-row vector of length M (one value per output row), e.g. rstd.

    Needed when M == N (the kind cannot be inferred from the shape); harmless otherwise.
    """


@dataclass(frozen=True)
class RowVecLoad:
    """Pin an operand as a per-column vector of length N (one value per output column), e.g. gamma."""


@dataclass(frozen=True)
class ColVecReduce:
    """Reduce the fn's per-element value over N (across a row); the result is one value per row, shape (M,).

    ``combine``: ``"add"`` (sum), ``"max"`` or ``"max_abs"`` (the max of |value|, never negative).
    ``scaled=True`` (add only): the fn returns a pair ``(value, scale)`` and the sum is of ``value * scale``
    folded as one fma, e.g. ``(y, y)`` for a sum of squares (the scale may be any value, a scalar operand
    too). Tiles' partials merge in FP32. In ``acc_pair`` mode only unscaled.

    Padding: in a partial last tile (N % tile_n > 0) the GPU evaluates the fn at the padding columns too,
    with acc, c, tiles and :class:`RowVecLoad` vectors read as 0 (a :class:`ColVecLoad` and a scalar keep
    their values), and ``add``/``max_abs`` fold that value in (``max`` masks it). So the reduced value must
    be 0 there (``y * y``: fine; ``exp(acc)``, ``exp(c - lse_row)``: wrong at ragged shapes on the GPU,
    refused by the emulator at every shape). Add constants on the host. Rows past M are not in the result.
    Launches: 1, whatever the combine.
    """

    combine: Combine = "add"
    scaled: bool = False

    def __post_init__(self) -> None:
        _check_reduce(self.combine, self.scaled)


@dataclass(frozen=True)
class RowVecReduce:
    """Reduce the fn's per-element value over M (down a column); one value per column, shape (N,).

    Same ``combine`` / ``scaled`` and padding rules as :class:`ColVecReduce` (padding rows: M not a multiple
    of ``tile_m``). dgamma of an RMSNorm is one. Launches: 1.
    """

    combine: Combine = "add"
    scaled: bool = False

    def __post_init__(self) -> None:
        _check_reduce(self.combine, self.scaled)


@dataclass(frozen=True)
class OnlineLSEReduce:
    """Numerically stable log-sum-exp of the fn's value over N: one f32 value per row, shape (M,).

    Keeps a running (max, sum) per tile (one `exp` per element, its GPU precision); the partials are merged
    with logsumexp in FP32. Padding columns are masked. Launches: 9 (torch.logsumexp over the tiles'
    partials).
    """


@dataclass(frozen=True)
class ColVecSelect:
    """Gather, per row m, the fn's value at column ``idx[m]``: one exact f32 value per row, shape (M,).

    ``index`` names the integer operand (int32/int64, shape (M,)) passed to :func:`gemm` by keyword
    (``index="targets"`` for an operand ``targets``; it needs no pin). The value is the fn's, in FP32
    (unrounded). Rows whose index is outside [0, N) (a negative ignore_index too) are not written and come
    back as NaN (in this sink's result only). Launches: 1 (the NaN fill).
    """

    index: str = "target"

    def __post_init__(self) -> None:
        # a declaration's fields are read where the candidate's code runs: one of another type (a callable
        # behind `.index(...)`, an allowed method's name) would carry it past the static check
        if type(self.index) is not str or not self.index.isidentifier():
            raise ValueError(f"ColVecSelect's index must name the integer operand (a str such as "
                             f"'targets'), got {self.index!r}")


@dataclass(frozen=True)
class HeadRstd:
    """A per-(row, head) statistic of acc the kernel computes, a value of the fn:
    ``rsqrt(mean(acc**2) + eps)`` over each row's group of ``head_dim`` columns, of acc before the fn's math
    (QK-norm: ``acc * rstd * w``, w a RowVecLoad). ``stats={"rstd": HeadRstd(128)}`` feeds the fn parameter
    ``rstd``; ``gemm(..., rstd=HeadRstd(hd, eps=eps))`` sets head_dim and eps per call (the task's eps, a
    head_dim per shape). Element or acc_pair mode (paired there, as acc); head_dim a multiple of 16 up to 256
    dividing N, every tile whole heads (a config's tile_n too). ``out="name"`` also returns it, (M, N //
    head_dim) FP32. Launches: 0.
    """

    head_dim: int | None = None
    eps: float = 1e-6
    out: str | None = None

    def __post_init__(self) -> None:
        if self.head_dim is None:  # given at the call
            pass
        elif type(self.head_dim) is not int or not 16 <= self.head_dim <= MAX_HEAD_DIM or self.head_dim % 16:
            raise ValueError(f"HeadRstd's head_dim must be a multiple of 16 from 16 to {MAX_HEAD_DIM} (a "
                             f"head lies within one tile), got {self.head_dim!r}")
        if not isinstance(self.eps, (int, float)) or isinstance(self.eps, bool) or not self.eps >= 0:
            raise ValueError(f"HeadRstd's eps must be a number >= 0, got {self.eps!r}")
        if self.out is not None and (type(self.out) is not str or not self.out.isidentifier()):
            raise ValueError(f"HeadRstd's out must name the returned statistic (a str), got {self.out!r}")


#: The widest head a :class:`HeadRstd` takes: a head lies within one tile, and SM90's tiles are at most 256
#: columns wide (cooperative 128x256).
MAX_HEAD_DIM = 256

Pin = ColVecLoad | RowVecLoad
Sink = ColVecReduce | RowVecReduce | OnlineLSEReduce | ColVecSelect


def _check_reduce(combine: str, scaled: bool) -> None:
    if type(scaled) is not bool:
        raise ValueError(f"scaled must be True or False, not {scaled!r}")
    if type(combine) is not str or combine not in ("add", "max", "max_abs"):
        raise ValueError(f"combine must be 'add', 'max' or 'max_abs', not {combine!r}")
    if scaled and combine != "add":
        raise ValueError("scaled=True is only allowed with combine='add'")
