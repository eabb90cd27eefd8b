"""The torch emulator of the epilogue contract (backend ``torch``).

acc = A @ B in FP32; the fn is evaluated once over whole FP32 tensors (an element-wise fn gives the same
values it gives per element on the GPU); reductions are finalised over the full row/column; outputs are
rounded to their dtype. It runs anywhere torch runs, so a candidate's algebra is checked on a CPU.

It has no tiles, so it also holds a call to the one rule the GPU's tiles add (:func:`check_padding`): an
``add`` or ``max_abs`` reduce must fold 0 at a partial last tile's padding, or the emulator would accept what
the GPU gets wrong at every shape its tiles do not divide.
"""

from __future__ import annotations

from typing import Any

import torch

from ._call import GemmCall
from ._config import EpilogueError
from ._ops import ColVecReduce, ColVecSelect, HeadRstd, OnlineLSEReduce, RowVecReduce, Sink
from ._values import Pair


def _lanes(t: torch.Tensor) -> Pair:
    return Pair(t[..., 0::2], t[..., 1::2])


def _interleave(p: Pair, m: int, width: int) -> torch.Tensor:
    a = torch.broadcast_to(torch.as_tensor(p.a, dtype=torch.float32), (m, width // 2))
    b = torch.broadcast_to(torch.as_tensor(p.b, dtype=torch.float32), (m, width // 2))
    return torch.stack((a, b), dim=-1).reshape(m, width)


#: What a Pair where one value belongs means, by the epilogue's mode.
_PAIR_ADVICE = {
    "acc_pair": "in acc_pair mode extra outputs are half width: return one lane's value",
    "packed": "in packed mode only D is written as pack(); an extra output or a reduce takes one value per "
              "accumulator element: give each lane an output or a reduce of its own",
    "element": "pack() writes D in packed or acc_pair mode only",
}


def _full(v: Any, shape: tuple[int, int], what: str, mode: str) -> torch.Tensor:
    if isinstance(v, Pair):
        raise EpilogueError(f"{what} is a Pair here; it needs one value per element "
                            f"({_PAIR_ADVICE.get(mode, _PAIR_ADVICE['element'])})")
    if isinstance(v, (tuple, list)):
        raise EpilogueError(f"{what} must be a single value, got a {type(v).__name__}")
    t = torch.as_tensor(v, dtype=torch.float32)
    try:
        # dense, as the kernel's buffers: no stride-0 tell
        return torch.broadcast_to(t, shape).float().contiguous()
    except RuntimeError as exc:
        raise EpilogueError(
            f"{what} has shape {tuple(t.shape)}, which does not broadcast to the tile {shape}"
        ) from exc


def _per_element(name: str, sink: Sink, value: Any, call: GemmCall, shape: tuple[int, int]) -> torch.Tensor:
    """What a sink folds at each element of a (rows, columns) ``shape``: in acc_pair mode both lanes,
    interleaved; for a scaled sink, value times scale."""
    if call.epi.mode == "acc_pair":
        if not (isinstance(value, tuple) and len(value) == 2):
            raise EpilogueError(
                f"reduce {name!r}: in acc_pair mode return one value per lane, (lane0, lane1)"
            )
        lanes = Pair(*(_full(v, shape, f"reduce {name!r}", call.epi.mode) for v in value))
        stacked = _interleave(lanes, shape[0], 2 * shape[1])  # sinks span both lanes: the full N
    elif getattr(sink, "scaled", False):
        if not (isinstance(value, tuple) and len(value) == 2):
            raise EpilogueError(f"reduce {name!r} is scaled: return a (value, scale) tuple")
        stacked = (_full(value[0], shape, f"reduce {name!r}", call.epi.mode)
                   * _full(value[1], shape, f"reduce {name!r}", call.epi.mode))
    else:
        stacked = _full(value, shape, f"reduce {name!r}", call.epi.mode)
    return stacked


def _reduce(name: str, sink: Sink, value: Any, call: GemmCall, shape: tuple[int, int]) -> torch.Tensor:
    dim = 0 if isinstance(sink, RowVecReduce) else 1
    stacked = _per_element(name, sink, value, call, shape)
    if isinstance(sink, OnlineLSEReduce):
        return torch.logsumexp(stacked, dim=1)
    if isinstance(sink, ColVecSelect):
        idx = call.indices[sink.index].long()
        valid = (idx >= 0) & (idx < stacked.shape[1])
        picked = stacked.gather(1, idx.clamp(0, stacked.shape[1] - 1)[:, None])[:, 0]
        return torch.where(valid, picked, torch.full_like(picked, float("nan")))
    assert isinstance(sink, (ColVecReduce, RowVecReduce))
    if sink.combine == "add":
        return stacked.sum(dim)
    if sink.combine == "max_abs":
        return stacked.abs().amax(dim)
    return stacked.amax(dim)


def run(call: GemmCall) -> dict[str, torch.Tensor]:
    """Evaluate one GEMM+epilogue call exactly as the contract defines it, in FP32."""
    epi = call.epi
    acc = call.A.float() @ call.B.float()
    m, n = acc.shape
    paired = epi.mode == "acc_pair"
    tensors = {name: op.value.float() for name, op in call.operands.items() if op.kind != "scalar"}
    result = _evaluate(call, acc, None if call.C is None else call.C.float(), tensors)
    declared = {"D", *epi.outputs, *epi.sinks}
    missing = [k for k in (*epi.outputs, *epi.sinks) if k not in result]
    unknown = [k for k in result if k not in declared]
    if missing:
        raise EpilogueError(f"epilogue fn {epi.name} did not return declared names {', '.join(missing)}")
    if unknown:
        raise EpilogueError(f"epilogue fn {epi.name} returned undeclared names "
                            f"{', '.join(map(str, unknown))}; declare them in outputs= or reduces=")

    out: dict[str, torch.Tensor] = {}
    d = result.get("D")
    if epi.mode == "packed":
        if not isinstance(d, Pair):
            raise EpilogueError("packed mode: return {'D': pack(dx, dy)}")
        out["D"] = _interleave(d, m, 2 * n).to(call.out_dtype)
    elif paired:
        if d is None:
            out["D"] = acc.to(call.out_dtype)
        elif not isinstance(d, Pair):
            raise EpilogueError("acc_pair mode: 'D' must be written as pack(lane0, lane1)")
        else:
            out["D"] = _interleave(d, m, n).to(call.out_dtype)
    else:
        out["D"] = (acc if d is None else _full(d, (m, n), "'D'", epi.mode)).to(call.out_dtype)
    if not call.store_d:
        del out["D"]
    width = n // 2 if paired else n
    for name in epi.outputs:
        out[name] = _full(result[name], (m, width), f"output {name!r}", epi.mode).to(call.out_dtype)
    sink_shape = (m, width)
    for name, sink in epi.sinks.items():
        out[name] = _reduce(name, sink, result[name], call, sink_shape)
    for name, param in epi.stat_outputs.items():
        out[name] = head_rstd(acc, call.stats[param])[:, ::call.stat_width(param)].contiguous()
    check_padding(call)
    return out


def head_rstd(acc: torch.Tensor, stat: HeadRstd) -> torch.Tensor:
    """A :class:`HeadRstd` at every element of ``acc``: ``rsqrt(mean(acc**2) + eps)`` over each row's group of
    ``head_dim`` columns. A block narrower than a head is the padding check's, where acc is 0 (a whole head of
    padding on the GPU: gemm() holds N, and the tile, to whole heads)."""
    rows, cols = acc.shape
    width = stat.head_dim
    assert width is not None  # gemm() refuses a call without one
    if cols % width:
        return torch.rsqrt(torch.full_like(acc, stat.eps))
    heads = acc.reshape(rows, cols // width, width)
    rstd = torch.rsqrt(heads.square().mean(-1, keepdim=True) + stat.eps)
    return rstd.expand_as(heads).reshape(rows, cols)


def _evaluate(call: GemmCall, acc: torch.Tensor, c: torch.Tensor | None,
              tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The fn on FP32 ``acc`` (rows, columns), ``c`` and the tensor operands (column vectors (rows, 1), row
    vectors (1, columns), tiles like acc), scalars from the call; paired lanes where the mode pairs them."""
    epi = call.epi
    paired = epi.mode == "acc_pair"
    args: dict[str, Any] = {}
    for name, op in call.operands.items():
        if op.kind == "scalar":
            args[name] = torch.tensor(op.value, dtype=torch.float32)
        elif op.kind == "col":
            args[name] = tensors[name].reshape(-1, 1)
        else:  # row (1, N) or tile (M, N): paired lanes in acc_pair mode
            args[name] = _lanes(tensors[name]) if paired else tensors[name]
    if c is not None:
        args["c"] = _lanes(c) if epi.mode in ("acc_pair", "packed") else c
    for name, stat in call.stats.items():  # of the whole accumulator; paired like it in acc_pair mode
        args[name] = _lanes(head_rstd(acc, stat)) if paired else head_rstd(acc, stat)
    result = epi.fn(_lanes(acc) if paired else acc, **args)
    if not isinstance(result, dict):
        raise EpilogueError(f"epilogue fn {epi.name} must return a dict, got {type(result).__name__}")
    return result


def check_padding(call: GemmCall) -> None:
    """Refuse an ``add`` or ``max_abs`` reduce that folds anything but 0 at a partial last tile's padding.

    There the GPU evaluates the fn with acc, c and the tile operands read as 0 (columns past N for a
    :class:`ColVecReduce`, rows past M for a :class:`RowVecReduce`), and folds the value into the row's or
    column's result: ``exp(acc)`` or ``acc + 1.0`` come out wrong wherever the tiles do not divide the shape.
    The vector along the padding is 0 there too; the one along the kept axis is checked both as it is and as
    0, and a scalar keeps its value."""
    epi, dev = call.epi, call.A.device
    width = 2 if epi.mode == "acc_pair" else 1  # one padding element: a pair of columns in acc_pair mode
    axes = (("col", ColVecReduce, "N", "RowVecLoad", "ColVecLoad"),
            ("row", RowVecReduce, "M", "ColVecLoad", "RowVecLoad"))
    for kind, sink_type, across, padded, kept_vec in axes:
        sinks = {name: s for name, s in epi.sinks.items() if type(s) is sink_type and s.combine != "max"}
        if not sinks:
            continue
        kept = call.m if kind == "col" else call.n
        shape = (kept, width) if kind == "col" else (1, call.n)
        c_width = 2 * shape[1] if epi.mode == "packed" else shape[1]
        for vectors_kept in (True, False):
            tensors = {}
            for name, op in call.operands.items():
                if op.kind == kind:  # the vector along the kept axis
                    v = op.value.float().reshape(shape if kind == "row" else (kept, 1))
                    tensors[name] = v if vectors_kept else torch.zeros_like(v)
                elif op.kind == "tile":
                    tensors[name] = torch.zeros(shape, device=dev)
                elif op.kind != "scalar":  # the vector along the padding: past the edge
                    tensors[name] = torch.zeros(1, shape[1] if op.kind == "row" else 1, device=dev)
            c = None if call.C is None else torch.zeros(shape[0], c_width, device=dev)
            result = _evaluate(call, torch.zeros(shape, device=dev), c, tensors)
            sink_shape = (shape[0], shape[1] // 2) if epi.mode == "acc_pair" else shape
            for name, sink in sinks.items():
                folded = _per_element(name, sink, result[name], call, sink_shape)
                if bool((folded != 0).any()):
                    # the largest, not the first: a row's 1e-42 would read as noise
                    value = folded.flatten()[folded.abs().flatten().argmax()].item()
                    raise EpilogueError(
                        f"reduce {name!r} folds up to {value:g}, not 0, where acc, c and the tile operands "
                        f"are 0 ({padded} operands too; a {kept_vec} keeps its value, and the check tries "
                        "both it and 0): "
                        f"on the GPU a partial last tile ({across} not a multiple of the tile) evaluates the "
                        f"fn at its padding and folds that in, so the result is wrong wherever the tiles do "
                        f"not divide {across}; make the reduced value 0 there (a constant term belongs on "
                        "the host; combine=\"max\" masks the padding, add and max_abs do not; a sum of "
                        "exp over the row is OnlineLSEReduce's, which masks it and keeps the exp in range)")
