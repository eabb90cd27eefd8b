"""The candidate's front end: the ``@epilogue`` declaration, the ``gemm()`` call, and the operand rules.

A candidate declares ``@epilogue(...)`` over a plain fn ``fn(acc, **operands) -> dict`` and calls
``gemm(epi, A, B, C, **operands)``. Everything a backend needs (operand kinds, shapes, dtypes, the
configs asked for) is resolved here once into a :class:`~._call.GemmCall`, so the emulator and QuACK see
exactly the same request and a mistake is reported identically on the CPU and on the GPU.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from . import backend
from ._call import Checked, Epilogue, GemmCall, Operand, OperandKind
from ._config import TMA_ALIGN_BYTES, Config, EpilogueError, Mode, tma_row_multiple
from ._ops import (
    ColVecLoad,
    ColVecReduce,
    ColVecSelect,
    HeadRstd,
    OnlineLSEReduce,
    Pin,
    RowVecLoad,
    RowVecReduce,
    Sink,
)
from ._schedule import pinned_config

RESERVED = frozenset({"acc", "D"})


def epilogue(
    outputs: tuple[str, ...] | list[str] = (),
    *,
    operands: Mapping[str, Pin] | None = None,
    reduces: Mapping[str, Sink] | None = None,
    mode: Mode = "element",
    stats: Mapping[str, HeadRstd] | None = None,
) -> Callable[[Callable[..., dict[str, Any]]], Epilogue]:
    """Declare a GEMM epilogue: ``fn(acc, **operands) -> {"D": ..., <outputs>, <reduces>}``.

    The fn runs on the FP32 accumulator while the output tile is still on chip. Its first parameter must
    be ``acc`` (the rest in any order); a parameter named ``c`` receives the GEMM's C operand (``gemm(...,
    C=...)``); every other parameter is an operand passed to :func:`gemm` by keyword, whose kind follows from
    its shape: a number or 1-element tensor is a scalar, shape (M, N) a tile, (N,) or (1, N) a row vector,
    (M,) or (1, M) a column vector; vectors bf16 or fp32. A 1-element tensor is read to the host each call
    (a wait and a launch): pass numbers, or a GPU value as a vector (``t.expand(M).contiguous()``). Pin
    vectors with ``operands={"x": ColVecLoad()}`` / ``RowVecLoad()`` (required when M == N).

    Args:
        outputs: extra full-tile outputs (each in D's dtype; half width in ``acc_pair`` mode); each adds its
            write, and in element mode no tile rule.
        operands: pins for vector operands.
        reduces: reduction sinks by name (:class:`ColVecReduce`, :class:`RowVecReduce`,
            :class:`OnlineLSEReduce`, :class:`ColVecSelect`); the fn returns each one's per-element value.
        stats: statistics of acc the kernel computes (:class:`HeadRstd`), by the fn parameter reading them.
        mode: ``"element"`` (default; one value per accumulator element), ``"acc_pair"`` (adjacent columns
            (2j, 2j+1) arrive as one Pair: ``g, u = unpack(acc)``, g from column 2j; extra outputs are half
            width; reduces unscaled Col/RowVecReduce only; vectors, tiles and ``c`` arrive paired too, except
            column vectors), or ``"packed"`` (a gated pair's backward; an ungated one is element mode with C.
            ``c`` is a 16-bit (M, 2N) interleaved tensor, ``x, y = unpack(c)``,
            x from column 2j; ``acc`` is a plain (M, N) value;
            ``"D": pack(dx, dy)`` writes (M, 2N) in C's dtype; requires a ``c`` parameter and ``"D"``).

    Return dict: ``"D"`` (optional except in packed mode; when missing, the raw accumulator is stored, columns
    in order, the same kernel as ``"D": acc``), every declared output and every reduce;
    one value may feed several of them. A ``scaled`` reduce takes a ``(value, scale)`` tuple; in ``acc_pair``
    mode a reduce takes one value per lane, ``(lane0, lane1)``, each folded as a column of its own (an add of
    ``(v, v)`` counts v twice).

    Shapes by mode, for a GEMM of (M, K) by (K, N): element: D and each extra output (M, N); acc_pair: D (M,
    N), each extra output (M, N/2); packed: C and D (M, 2N) interleaved, each extra output (M, N), row vectors
    and RowVecReduce results of length N (a reduce folds one value per accumulator element: a column statistic
    of the (M, 2N) gradient takes one reduce per lane, interleaved after the call).

    Names: parameters, outputs and reduces must all differ; ``acc``, ``D`` and (as an operand) ``c`` are
    taken, and an operand cannot be named like a parameter of :func:`gemm` (``A``, ``B``, ``C``, ``epi``,
    ``out_dtype``, ``config``, ``store_d``); no other name is. Names are case-sensitive:
    an operand ``b`` is not ``B``. They are the kernel's own (forward() maps them to the task's outputs);
    a module constant ``C`` is not gemm's ``C``.
    """
    pins = dict(operands or {})
    sinks = dict(reduces or {})
    outs = tuple(outputs)
    stat_ops = dict(stats or {})

    def decorate(fn: Callable[..., dict[str, Any]]) -> Epilogue:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise EpilogueError(f"@epilogue needs a plain function, got {fn!r}") from exc
        names = list(sig.parameters)
        if not names or names[0] != "acc":
            raise EpilogueError(f"epilogue fn {fn.__name__}: the first parameter must be named 'acc', got "
                                f"{names[:1]}")
        params = tuple(names[1:])
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise EpilogueError(f"epilogue fn {fn.__name__}: *args/**kwargs are not allowed ({p.name})")
        if mode not in ("element", "acc_pair", "packed"):
            raise EpilogueError(f"mode must be 'element', 'acc_pair' or 'packed', not {mode!r}")
        clash = RESERVED & (set(params) | set(outs) - {"D"} | set(sinks))
        if clash:
            raise EpilogueError(f"names {', '.join(sorted(clash))} are reserved ('acc' is the accumulator, "
                                "'D' the main output)")
        dup = (set(outs) & set(sinks)) | (set(params) & (set(outs) | set(sinks)))
        if dup:
            raise EpilogueError(f"names {', '.join(sorted(dup))} are used twice (parameters, outputs and "
                                "reduces must differ)")
        for name, pin in pins.items():
            if name not in params or name == "c":
                raise EpilogueError(f"operands pins {name!r}, which is not an operand parameter of "
                                    f"{fn.__name__}")
            if not isinstance(pin, (ColVecLoad, RowVecLoad)):
                raise EpilogueError(f"operands[{name!r}] must be ColVecLoad() or RowVecLoad(), got {pin!r}")
        for name, sink in sinks.items():
            if not isinstance(sink, (ColVecReduce, RowVecReduce, OnlineLSEReduce, ColVecSelect)):
                raise EpilogueError(f"reduces[{name!r}] must be a ColVecReduce, RowVecReduce, "
                                    "OnlineLSEReduce or ColVecSelect")
            scaled = getattr(sink, "scaled", False)
            if mode == "acc_pair" and (scaled or isinstance(sink, (OnlineLSEReduce, ColVecSelect))):
                raise EpilogueError(f"reduces[{name!r}]: acc_pair mode allows only unscaled "
                                    "ColVecReduce/RowVecReduce")
            if isinstance(sink, ColVecSelect) and sink.index in params:
                raise EpilogueError(f"reduces[{name!r}]: the index operand {sink.index!r} feeds the select, "
                                    "not the fn; drop it from the parameters")
        if mode == "packed" and "c" not in params:
            raise EpilogueError("packed mode needs a 'c' parameter (the interleaved 16-bit preactivation)")
        _check_stats(fn.__name__, stat_ops, params, pins, mode, {*outs, *sinks})
        return Epilogue(fn=fn, outputs=outs, pins=pins, sinks=sinks, mode=mode, params=params, stats=stat_ops)

    return decorate



def _check_stats(fn: str, stats: dict[str, HeadRstd], params: tuple[str, ...], pins: Mapping[str, Pin],
                 mode: Mode, results: set[str]) -> None:
    """The ``stats=`` declarations: each a :class:`HeadRstd` for a parameter of the fn that nothing else
    feeds, not in packed mode (QuACK's prepass takes no packed C), its ``out`` a result name of its own."""
    outs = [s.out for s in stats.values() if isinstance(s, HeadRstd) and s.out]
    for name, stat in stats.items():
        if not isinstance(stat, HeadRstd):
            raise EpilogueError(f"stats[{name!r}] must be a HeadRstd, got {stat!r}")
        if name not in params or name == "c":
            raise EpilogueError(f"stats names {name!r}, which is not an operand parameter of {fn}")
        if name in pins:
            raise EpilogueError(f"{name!r} is both a stat and a pinned operand: the kernel computes a stat, "
                                "gemm() passes an operand")
        if mode == "packed":
            raise EpilogueError(f"stats[{name!r}]: a HeadRstd runs in element and acc_pair modes")
        if stat.out is not None and (not isinstance(stat.out, str) or stat.out in RESERVED | set(params)
                                     | results or outs.count(stat.out) > 1):
            raise EpilogueError(f"stats[{name!r}]: out={stat.out!r} must be a name of its own (not a "
                                "parameter, output, reduce, 'acc' or 'D')")


def _call_stats(epi: Epilogue, operands: dict[str, Any]) -> dict[str, HeadRstd]:
    """The statistics of one call, taken out of ``operands``: each declared one, or the :class:`HeadRstd`
    gemm() was given under its name (a head width per shape, the task's eps), with the declaration's
    ``out``."""
    stats = dict(epi.stats)
    for name in epi.stats:
        if name in operands:
            given = operands.pop(name)
            if not isinstance(given, HeadRstd):
                raise EpilogueError(f"{name!r} is a stat (stats=), which the kernel computes: pass nothing, "
                                    f"or {name}=HeadRstd(head_dim, eps=...) for this call, not a "
                                    f"{type(given).__name__}")
            stats[name] = dataclasses.replace(given, out=epi.stats[name].out)
    return stats


#: What D and the extra outputs can be stored as.
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _is_scalar(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or (isinstance(v, torch.Tensor)
                                                                         and v.numel() == 1)


def operand_kind(epi: Epilogue, name: str, v: Any, m: int, n: int) -> OperandKind:
    """Decide an operand's kind from its shape (and pin), as QuACK does, but with one clear message."""
    if _is_scalar(v):
        return "scalar"
    if not isinstance(v, torch.Tensor):
        raise EpilogueError(f"operand {name!r} must be a number or a torch.Tensor, got {type(v).__name__}")
    shape = tuple(v.shape)
    if v.dim() == 2 and shape == (m, n):
        if name in epi.pins:
            raise EpilogueError(f"operand {name!r} is pinned as a vector but has the tile shape {shape}")
        return "tile"
    if v.dim() == 1 or (v.dim() == 2 and shape[0] == 1):
        length = shape[-1]
        pin = epi.pins.get(name)
        if isinstance(pin, ColVecLoad) or (pin is None and length == m and m != n):
            kind: OperandKind = "col"
            want = m
        elif isinstance(pin, RowVecLoad) or (pin is None and length == n and m != n):
            kind, want = "row", n
        elif pin is None and length == m == n:
            raise EpilogueError(
                f"operand {name!r} of length {length}: M == N, so row/column cannot be inferred; "
                f"pin it with operands={{{name!r}: ColVecLoad()}} or RowVecLoad()"
            )
        else:
            raise EpilogueError(f"operand {name!r} has length {length}, matching neither M={m} (column) nor "
                                f"N={n} (row)")
        if length != want:
            raise EpilogueError(f"operand {name!r} is a {kind} vector and must have length {want}, got "
                                f"{length}")
        return kind
    one_d = (f"; a vector is passed 1-D (or as (1, length)), not as a column: {name}.view(-1)"
             if v.dim() == 2 and shape[1] == 1 and shape[0] in (m, n) else "")
    raise EpilogueError(
        f"operand {name!r} has shape {shape}: expected a scalar, a tile ({m}, {n}), a row vector ({n},) "
        f"or a column vector ({m},){one_d}"
    )


def operand(kind: OperandKind, v: Any) -> Operand:
    """An operand of a known kind as backends take it: scalars as floats, vectors as (1, len)."""
    if kind == "scalar":
        if isinstance(v, torch.Tensor):  # a meta tensor (the checker's shapes-only run) has no value to read
            return Operand(kind, 0.0 if v.is_meta else float(v.item()))
        return Operand(kind, float(v))
    if kind == "tile":
        return Operand(kind, v)
    # a view, which the runner's op log would not record: skip its Python
    with torch._C._DisableTorchDispatch():
        return Operand(kind, v.reshape(1, v.shape[-1]))  # trip through the log (issue 9's host-bound rows)


#: Signatures one Epilogue remembers before it forgets them all (a forward whose shapes never repeat).
MAX_CHECKED_CALLS = 256


def _tensor_signature(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.dtype, t.shape, t.stride(), t.storage_offset())


def _signature(epi: Epilogue, A: Any, B: Any, C: Any, operands: dict[str, Any], out_dtype: Any, config: Any,
               store_d: Any, stats: Mapping[str, HeadRstd]) -> Hashable | None:
    """Everything gemm()'s checks read, as a key (values never: a scalar by its type, a tensor by its
    metadata), the running schedule's pin for the call included; None where an argument is of no kind the
    checks accept (they then run, and say what is wrong)."""
    tensors = (A, B) if C is None else (A, B, C)
    if (
        not all(isinstance(t, torch.Tensor) for t in tensors)
        or type(store_d) is not bool
        or A.dim() != 2
        or B.dim() != 2
    ):
        return None
    if not (out_dtype is None or isinstance(out_dtype, torch.dtype)) or not (config is None
                                                                             or isinstance(config, Config)):
        return None
    values: list[tuple[Any, ...]] = []
    for name, v in operands.items():
        if isinstance(v, torch.Tensor):
            values.append((name, v.dtype, v.shape))
        elif isinstance(v, (int, float)):
            values.append((name, type(v)))
        else:
            return None
    pinned = pinned_config((epi.name, A.shape[0], B.shape[1], A.shape[1]))
    return (*(_tensor_signature(t) for t in tensors), C is None, tuple(values), out_dtype, config, store_d,
            pinned, tuple(stats.items()))


def gemm(
    epi: Epilogue,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    config: Config | None = None,
    store_d: bool = True,
    **operands: Any,
) -> dict[str, torch.Tensor]:
    """Run ``D = epi(A @ B)`` as one fused GEMM kernel and return its results by name.

    Args:
        epi: an :func:`epilogue`.
        A: (M, K), bf16 or fp16. B: (K, N), same dtype, any strides (a transposed view is free).
        C: optional (M, N) tensor read by the fn's ``c`` parameter (one (M, N) input: prefer C to a tile
            operand), bf16, fp16 or fp32 ((M, 2N) interleaved and
            16-bit in packed mode). C and an (M, N) tile operand each cost one read of their bytes; D and each
            extra output one write.
        out_dtype: the one dtype of D and the extra outputs (default: A's dtype; packed mode: C's).
        config: an explicit :class:`Config`, or None for the default (see :class:`Config`); a :func:`schedule`
            pin takes precedence.
        store_d: False skips writing D (saves its HBM traffic when only the extra outputs and reduces are
            needed, e.g. a SwiGLU activation); the result then has no "D". Not allowed in packed mode.
        **operands: the fn's other parameters, plus the index tensors of ColVecSelect reduces.

    Every tile the kernel moves (A, B, C, tile operands, D, the extra outputs) needs rows on a 16-byte grid
    (TMA): K, N and the output widths a multiple of 8 for 16-bit tensors, of 4 for fp32 (M too for an
    M-major A, as ``dy.t()``); gemm() says which one is off.

    Returns:
        ``{"D": ..., <outputs>..., <reduces>...}``; reduces come back finalised over the whole row/column:
        ColVecReduce/OnlineLSEReduce/ColVecSelect as (M,) f32, RowVecReduce as (N,) f32.

    Launches, as the task's budget counts them per forward() call: a gemm() call is 1, plus 1 finalisation per
    reduce sink, each sink its own (none are shared): ColVecReduce, RowVecReduce, ColVecSelect 1,
    OnlineLSEReduce 9; two ColVecReduce sinks make a gemm() 3. Every torch op in forward() that computes or
    fills is 1 more (``torch.logsumexp`` 9; views, ``torch.empty``, indexing gemm()'s result dict are free; a
    host helper says its count), and so is a strided vector or tile operand (its copy). The CPU and GPU
    stages both count.
    """
    if not isinstance(epi, Epilogue):
        raise EpilogueError("gemm() takes an @epilogue-decorated function as its first argument")
    stats = _call_stats(epi, operands)
    signature = _signature(epi, A, B, C, operands, out_dtype, config, store_d, stats)
    checked = epi.checked_calls.get(signature) if signature is not None else None
    if checked is None:
        checked = _check(epi, A, B, C, operands, out_dtype, config, store_d, stats)
        if signature is not None:
            if len(epi.checked_calls) >= MAX_CHECKED_CALLS:
                epi.checked_calls.clear()
            epi.checked_calls[signature] = checked
    resolved = {name: operand(kind, operands[name]) for name, kind in checked.kinds}
    indices = {idx: operands[idx] for idx in epi.index_operands}
    call = GemmCall(epi, A, B, C, resolved, indices, checked.out_dtype, config, store_d,
                    pinned=checked.pinned, signature=signature, call_stats=stats)
    return in_declared_order(epi, backend.active().run(call))


def in_declared_order(epi: Epilogue, results: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The results in one order on every backend: D, the extra outputs, the sinks, the statistics returned,
    as declared. QuACK's backend makes them in another (the selects last), so ``list(r)`` told the GPU from
    the CPU's backends (a red-team pass)."""
    order = ("D", *epi.outputs, *epi.sinks, *epi.stat_outputs)
    return {**{k: results[k] for k in order if k in results},
            **{k: v for k, v in results.items() if k not in order}}


def _check(epi: Epilogue, A: Any, B: Any, C: Any, operands: dict[str, Any], out_dtype: Any, config: Any,
           store_d: bool, stats: Mapping[str, HeadRstd]) -> Checked:
    """gemm()'s checks of a call, each with the rule it broke; what they concluded, for every later call of
    the same signature."""
    for label, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise EpilogueError(f"{label} must be a 2-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise EpilogueError(
                f"{label} must be bf16 or fp16 (the GEMM runs on tensor cores), got {t.dtype}"
            )
    if A.dtype != B.dtype:
        raise EpilogueError(f"A and B must have the same dtype, got {A.dtype} and {B.dtype}")
    if A.shape[1] != B.shape[0]:
        stored = ""
        if B.shape[1] == A.shape[1]:  # B's transpose would fit: which way round was it passed?
            stored = ("; B is a transposed view (a .t() of a (K, N) tensor): pass that tensor as it is stored"
                      if B.stride(0) == 1 and B.shape[0] > 1 else
                      "; B is (N, K) as nn.Linear stores a weight: pass its transposed view, w.t() (free)")
        raise EpilogueError(f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: B must be (K, N) with K = "
                            f"A.shape[1]{stored}")
    m, n = A.shape[0], B.shape[1]
    wants_c = "c" in epi.params
    if wants_c != (C is not None):
        raise EpilogueError("pass C=... exactly when the epilogue fn has a 'c' parameter")
    if C is not None:
        want = (m, 2 * n) if epi.mode == "packed" else (m, n)
        if tuple(C.shape) != want:
            raise EpilogueError(f"C must have shape {want}, got {tuple(C.shape)}")
        if epi.mode == "packed" and C.dtype not in (torch.bfloat16, torch.float16):
            raise EpilogueError("packed mode needs a 16-bit C")
    if epi.mode in ("acc_pair",) and n % 2:
        raise EpilogueError(f"acc_pair mode needs an even N, got {n}")
    for name, stat in stats.items():
        if stat.head_dim is None:
            raise EpilogueError(f"stats[{name!r}] declares no head_dim: pass {name}=HeadRstd(head_dim, "
                                "eps=...) to gemm(), or declare HeadRstd(head_dim)")
        if n % stat.head_dim:
            raise EpilogueError(f"stats[{name!r}]: N={n} is not a multiple of HeadRstd's head_dim "
                                f"{stat.head_dim} (each row's heads are whole groups of columns)")
    expected = set(epi.operand_params) | set(epi.index_operands)
    missing, extra = expected - set(operands), set(operands) - expected
    # an index operand is named by its sink, not by the fn: say whose it is (a model added an fn parameter)
    sinks_of = {s.index: name for name, s in epi.sinks.items() if isinstance(s, ColVecSelect)}
    missing = {f"{m} (the index= of ColVecSelect sink {sinks_of[m]!r})" if m in sinks_of else m
               for m in missing}
    if missing or extra:
        raise EpilogueError(
            f"gemm({epi.name}) operands: missing {', '.join(sorted(missing))}, unexpected "
            f"{', '.join(sorted(extra))}"
            if missing and extra
            else f"gemm({epi.name}) is missing operands {', '.join(sorted(missing))}"
            if missing
            else f"gemm({epi.name}) got unexpected operands {', '.join(sorted(extra))} (not parameters of "
                 "the fn)"
        )
    kinds = tuple((p, operand_kind(epi, p, operands[p], m, n)) for p in epi.operand_params)
    indices = {}
    for idx in epi.index_operands:
        t = operands[idx]
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or t.shape != (m,):
            raise EpilogueError(f"select index {idx!r} must be an int32/int64 tensor of shape ({m},)")
        indices[idx] = t
    if not store_d and epi.mode == "packed":
        raise EpilogueError("packed mode always writes D (the interleaved gradient); store_d=False is not "
                            "allowed")
    dtype = C.dtype if (epi.mode == "packed" and C is not None) else (out_dtype or A.dtype)
    if dtype not in OUT_DTYPES:
        raise EpilogueError("out_dtype must be one of bf16, fp16, fp32 (what the kernel can store), got "
                            f"{dtype}")
    if config is not None and not isinstance(config, Config):
        raise EpilogueError("config must be a primitives.Config")
    key = (epi.name, m, n, int(A.shape[1]))
    pinned = pinned_config(key)
    resolved = {name: operand(kind, operands[name]) for name, kind in kinds}
    call = GemmCall(epi, A, B, C, resolved, indices, dtype, config, store_d, pinned=pinned, call_stats=stats)
    if pinned is not None:  # the config that runs (configs.chosen_config): the call's own is never built
        try:
            call.check_config(pinned)
        except EpilogueError as exc:
            raise EpilogueError(f"schedule entry {key}: {exc}") from None
    elif config is not None:
        call.check_config(config)
    _check_tma_alignment(call)
    return Checked(kinds, dtype, pinned)


#: What a misaligned row width means, where gemm() finds one: the width is the shape's, which a kernel's
#: author cannot change when the task set it (issue 48: an error never asks the kernel's author for what the
#: task owns).
SHAPE_MISALIGNED = ("that width is the shapes' gemm() was given: where it is the task's own (its K, N or an "
                    "output's width), the task's shape is misaligned and no kernel can run it (`coda-agent "
                    "validate` refuses such a task)")


def _row_width(t: torch.Tensor) -> int | None:
    """The element count of one of a 2-D tensor's rows as TMA moves them (its stride-1 dim), None without
    one."""
    return int(t.shape[1]) if t.stride(1) == 1 else int(t.shape[0]) if t.stride(0) == 1 else None


def _check_tma_alignment(call: GemmCall) -> None:
    """Every tile the kernel moves (A, B, C, tile operands, D and the extra outputs) has 16-byte-aligned rows:
    a width off that grid is the shape's (see :data:`SHAPE_MISALIGNED`), a stride or start off it the
    view's."""
    tiles = {"A": call.A, "B": call.B, **({"C": call.C} if call.C is not None else {})}
    for name, t in tiles.items():
        size = t.element_size()
        off = [s * size for s in t.stride() if s != 1] + [t.storage_offset() * size]
        if not any(b % TMA_ALIGN_BYTES for b in off):
            continue
        multiple, width = tma_row_multiple(size), _row_width(t)
        described = f"{name} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        if width is not None and width % multiple:
            raise EpilogueError(
                f"{described} has rows of {width} elements: the kernel moves tiles with TMA, which needs "
                f"every row to start on a {TMA_ALIGN_BYTES}-byte boundary, so rows of a multiple of "
                f"{multiple} elements; {SHAPE_MISALIGNED}"
            )
        raise EpilogueError(
            f"{described} has strides {t.stride()} and offset {t.storage_offset()}: the kernel moves tiles "
            f"with TMA, which needs every row to start on a {TMA_ALIGN_BYTES}-byte boundary: this view's "
            "rows do not (a slice of a wider tensor): pass a contiguous copy"
        )
    # Tile operands cross as contiguous copies (the QuACK backend makes them), outputs as fresh contiguous
    # buffers.
    rows = {f"operand {name!r}": (tuple(op.value.shape),
                                  op.value.dtype) for name, op in call.operands.items() if op.kind == "tile"}
    rows.update({f"output {name!r}": (shape, call.out_dtype) for name, shape in call.stored_shapes().items()})
    for name, (shape, dtype) in rows.items():
        size = dtype.itemsize
        if shape[1] % tma_row_multiple(size):
            raise EpilogueError(
                f"{name} is {shape} {str(dtype).removeprefix('torch.')}, {shape[1] * size} bytes a row: the "
                f"kernel moves it with TMA, which needs rows of a multiple of {TMA_ALIGN_BYTES} bytes, so of "
                f"a multiple of {tma_row_multiple(size)} elements; {SHAPE_MISALIGNED}"
            )
