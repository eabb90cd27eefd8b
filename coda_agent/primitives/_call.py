"""One gemm call as every backend takes it: the declared :class:`Epilogue` and the checked :class:`GemmCall`.

A leaf under the front end (``_epilogue``: ``epilogue()`` and ``gemm()``), the backends and the config rules
(``configs``): they all read a call through these classes, and none of them is imported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ._config import Config, EpilogueError, Major, Mode
from ._ops import ColVecSelect, HeadRstd, Pin, RowVecReduce, Sink

OperandKind = Literal["scalar", "row", "col", "tile"]


@dataclass
class Epilogue:
    """A declared epilogue: the fn plus what it reads and writes. Create it with :func:`epilogue`."""

    fn: Callable[..., dict[str, Any]]
    outputs: tuple[str, ...]
    pins: Mapping[str, Pin]
    sinks: Mapping[str, Sink]
    mode: Mode
    params: tuple[str, ...]  # the fn's parameters after ``acc``
    #: statistics the kernel computes from acc, by the fn parameter that reads them
    stats: Mapping[str, HeadRstd] = field(default_factory=dict)
    backend_cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)
    #: What :func:`gemm` accepted, by call signature (``_epilogue._signature``): a repeat call skips the
    #: checks.
    checked_calls: dict[Hashable, Checked] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", "epilogue")

    @property
    def operand_params(self) -> tuple[str, ...]:
        """Parameters fed from ``gemm(**operands)`` (everything but ``c`` and the statistics)."""
        return tuple(p for p in self.params if p != "c" and p not in self.stats)

    @property
    def stat_outputs(self) -> dict[str, str]:
        """The statistics returned as results (``HeadRstd(out=...)``): result name -> fn parameter."""
        return {stat.out: name for name, stat in self.stats.items() if stat.out}

    @property
    def index_operands(self) -> tuple[str, ...]:
        """Integer operands that feed :class:`ColVecSelect` sinks, not the fn."""
        return tuple(s.index for s in self.sinks.values() if isinstance(s, ColVecSelect))


@dataclass(frozen=True)
class Operand:
    """One resolved operand: its kind and its value (a float for scalars, else a 2-D tensor)."""

    kind: OperandKind
    value: Any


@dataclass(frozen=True)
class GemmCall:
    """A fully checked GEMM+epilogue request, the same object for every backend."""

    epi: Epilogue
    A: torch.Tensor  # (M, K)
    B: torch.Tensor  # (K, N)
    C: torch.Tensor | None
    operands: Mapping[str, Operand]  # fn operands (rank-2 vectors as (1, len))
    indices: Mapping[str, torch.Tensor]  # ColVecSelect index tensors, (M,)
    out_dtype: torch.dtype
    config: Config | None  # the call's own ``config=``
    store_d: bool = True
    #: The config the schedule in force pins for this call, checked: ``forward``'s :func:`schedule`, or the
    #: harness's (``configs.ScheduleOverride``), which replaces it. ``configs.chosen_config`` says which
    #: config runs.
    pinned: Config | None = None
    #: The metadata :func:`gemm` checked this call under (every tensor's dtype, shape, strides and offset,
    #: every scalar's type, the configs asked for): under one config, calls of equal signatures run one kernel
    #: through one plan. None: a call made outside gemm(); backends then derive their keys from the tensors.
    signature: Hashable | None = None
    #: The statistics this call computes (:class:`HeadRstd`, by fn parameter, each with its head_dim): the
    #: declaration's, or what gemm() was given for them. None: the declaration's.
    call_stats: Mapping[str, HeadRstd] | None = None

    @property
    def stats(self) -> Mapping[str, HeadRstd]:
        return self.epi.stats if self.call_stats is None else self.call_stats

    @property
    def tile_n_multiple(self) -> int:
        """What every tile's N must be a multiple of: each head of a :class:`HeadRstd` lies within one tile
        (1: no such rule)."""
        return math.lcm(1, *(stat.head_dim or 1 for stat in self.stats.values()))

    def check_tile(self, config: Config) -> None:
        """The tile rule of the call's statistics, as :meth:`Config.check` words a rule."""
        if config.tile_n % self.tile_n_multiple:
            raise EpilogueError(f"invalid Config: tile_n={config.tile_n} must be a multiple of "
                                f"{self.tile_n_multiple} (HeadRstd's head_dim: a head lies within one tile)")

    def stat_width(self, param: str) -> int:
        """The head width of statistic ``param`` in this call."""
        width = self.stats[param].head_dim
        assert width is not None  # gemm() refuses a call without one
        return width

    @property
    def m(self) -> int:
        return self.A.shape[0]

    @property
    def n(self) -> int:
        return self.B.shape[1]

    @property
    def key(self) -> tuple[str, int, int, int]:
        """(epilogue name, M, N, K): how a :func:`schedule` names this call."""
        return (self.epi.name, self.m, self.n, int(self.A.shape[1]))

    @property
    def b_major(self) -> Major:
        return b_major(self.B)

    @property
    def reads_tiles(self) -> bool:
        """Whether the epilogue reads an (M, N) tile from HBM (C, or a tile operand): what the load-ahead
        kernel loads under the mainloop (``Config.load_ahead``)."""
        return self.C is not None or any(op.kind == "tile" for op in self.operands.values())

    def check_config(self, config: Config) -> None:
        """``config`` against this call's mode, outputs, D and B's layout (:meth:`Config.check`), and its
        statistics' heads (:meth:`check_tile`)."""
        config.check(self.epi.mode, bool(self.epi.outputs), self.store_d, self.b_major)
        self.check_tile(config)

    def stored_shapes(self) -> dict[str, tuple[int, int]]:
        """The shapes of what the kernel stores (all in ``out_dtype``): D (unless ``store_d`` is off) and the
        extra outputs."""
        m, n = self.m, self.n
        width = n // 2 if self.epi.mode == "acc_pair" else n
        stored = {"D": (m, 2 * n) if self.epi.mode == "packed" else (m, n)} if self.store_d else {}
        stored.update({name: (m, width) for name in self.epi.outputs})
        return stored

    @property
    def operand_copies(self) -> int:
        """The vector and tile operands the GPU backend copies to contiguous memory before the launch (one
        kernel each): the launch estimate counts them."""
        return sum(o.kind != "scalar" and not o.value.is_contiguous() for o in self.operands.values())

    def hbm_bytes(self) -> dict[str, int]:
        """The bytes this call moves through HBM at the least (each tensor once), by what moves them: the
        GEMM's operands ``A``/``B``, and the epilogue's: ``C``, ``tiles`` (full-tile operands), ``vectors``
        (row/column operands, select indices), ``D``, ``outputs`` (extra outputs), ``reduces`` (each sink's
        (M,) or (N,) f32 result) and ``copies`` (the contiguous copy the backend makes of a strided vector or
        tile operand, :meth:`operand_copies`: written, and its source read). The runner's op log records it;
        ``verifier.cost`` turns it into the cost estimate."""

        def size(t: torch.Tensor) -> int:
            return int(t.numel()) * t.element_size()

        def copied(t: torch.Tensor) -> int:  # an expanded source is read once, however often it repeats
            return size(t) + min(size(t), t.untyped_storage().nbytes())

        out = torch.finfo(self.out_dtype).bits // 8  # no tensor made: the runner's op log would record it
        stored = {name: shape[0] * shape[1] * out for name, shape in self.stored_shapes().items()}
        return {
            "A": size(self.A), "B": size(self.B), "C": size(self.C) if self.C is not None else 0,
            "tiles": sum(size(o.value) for o in self.operands.values() if o.kind == "tile"),
            "vectors": sum(size(o.value) for o in self.operands.values() if o.kind in ("row", "col"))
            + sum(size(t) for t in self.indices.values()),
            "D": stored.pop("D", 0), "outputs": sum(stored.values()),
            "reduces": sum(4 * (self.n if isinstance(s, RowVecReduce)
                                else self.m) for s in self.epi.sinks.values())
            + sum(4 * self.m * (self.n // self.stat_width(p)) for p in self.epi.stat_outputs.values()),
            "copies": sum(copied(o.value) for o in self.operands.values()
                          if o.kind != "scalar" and not o.value.is_contiguous()),
        }

    def stored_buffers(self, factory: Callable[..., torch.Tensor] = torch.empty) -> dict[str, torch.Tensor]:
        """Buffers for what the kernel stores, on A's device (see :meth:`stored_shapes`)."""
        return {name: factory(shape, dtype=self.out_dtype,
                              device=self.A.device) for name, shape in self.stored_shapes().items()}

    def zero_results(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Zeros shaped as the kernel's results, on A's device: (D and the extra outputs, the reductions)."""
        m, n, dev = self.m, self.n, self.A.device
        stored = self.stored_buffers(torch.zeros)
        reduced = {
            name: torch.zeros(n if isinstance(sink, RowVecReduce) else m, dtype=torch.float32, device=dev)
            for name, sink in self.epi.sinks.items()
        }
        reduced.update({out: torch.zeros(m, n // self.stat_width(p), dtype=torch.float32, device=dev)
                        for out, p in self.epi.stat_outputs.items()})
        return stored, reduced


@dataclass(frozen=True)
class Checked:
    """What :func:`gemm`'s checks concluded about a call signature: each operand's kind, D's dtype and the
    running schedule's pin for the call (checked; the call's own config is checked where nothing is
    pinned)."""

    kinds: tuple[tuple[str, OperandKind], ...]
    out_dtype: torch.dtype
    pinned: Config | None


#: How a backend runs one call: the results by name.
Runner = Callable[[GemmCall], dict[str, torch.Tensor]]


def b_major(B: torch.Tensor) -> Major:
    """B's (K, N) layout as QuACK reads it (``gemm_tvm_ffi_utils.get_major`` of its (N, K) view)."""
    return "k" if B.stride(0) == 1 else "n"
