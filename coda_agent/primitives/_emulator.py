"""The torch emulator of the epilogue contract (backend ``torch``).

acc = A @ B in FP32; the fn is evaluated once over whole FP32 tensors (an element-wise fn gives the same
values it gives per element on the GPU); reductions are finalised over the full row/column; outputs are
rounded to their dtype. It runs anywhere torch runs, so a candidate's algebra is checked on a CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from ._call import GemmCall
from ._config import EpilogueError
from ._ops import ColVecReduce, ColVecSelect, OnlineLSEReduce, RowVecReduce, Sink
from ._values import Pair


def _lanes(t: torch.Tensor) -> Pair:
    return Pair(t[..., 0::2], t[..., 1::2])


def _interleave(p: Pair, m: int, width: int) -> torch.Tensor:
    a = torch.broadcast_to(torch.as_tensor(p.a, dtype=torch.float32), (m, width // 2))
    b = torch.broadcast_to(torch.as_tensor(p.b, dtype=torch.float32), (m, width // 2))
    return torch.stack((a, b), dim=-1).reshape(m, width)


def _full(v: Any, shape: tuple[int, int], what: str) -> torch.Tensor:
    if isinstance(v, Pair):
        raise EpilogueError(f"{what} is a Pair here; it needs one value per element (in acc_pair mode extra "
                            "outputs are half width: return one lane's value)")
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


def _reduce(name: str, sink: Sink, value: Any, call: GemmCall, shape: tuple[int, int]) -> torch.Tensor:
    dim = 0 if isinstance(sink, RowVecReduce) else 1
    if call.epi.mode == "acc_pair":
        if not (isinstance(value, tuple) and len(value) == 2):
            raise EpilogueError(
                f"reduce {name!r}: in acc_pair mode return one value per lane, (lane0, lane1)"
            )
        lanes = Pair(*(_full(v, shape, f"reduce {name!r}") for v in value))
        stacked = _interleave(lanes, shape[0], 2 * shape[1])  # sinks span both lanes: the full N
    elif getattr(sink, "scaled", False):
        if not (isinstance(value, tuple) and len(value) == 2):
            raise EpilogueError(f"reduce {name!r} is scaled: return a (value, scale) tuple")
        stacked = _full(value[0], shape, f"reduce {name!r}") * _full(value[1], shape, f"reduce {name!r}")
    else:
        stacked = _full(value, shape, f"reduce {name!r}")
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
    args: dict[str, Any] = {}
    for name, op in call.operands.items():
        if op.kind == "scalar":
            v: Any = torch.tensor(op.value, dtype=torch.float32)
        elif op.kind == "col":
            v = op.value.float().reshape(m, 1)
        else:  # row (1, N) or tile (M, N): paired lanes in acc_pair mode
            v = op.value.float()
            v = _lanes(v) if paired else v
        args[name] = v
    if call.C is not None:
        c = call.C.float()
        args["c"] = _lanes(c) if epi.mode in ("acc_pair", "packed") else c
    result = epi.fn(_lanes(acc) if paired else acc, **args)
    if not isinstance(result, dict):
        raise EpilogueError(f"epilogue fn {epi.name} must return a dict, got {type(result).__name__}")
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
        out["D"] = (acc if d is None else _full(d, (m, n), "'D'")).to(call.out_dtype)
    if not call.store_d:
        del out["D"]
    width = n // 2 if paired else n
    for name in epi.outputs:
        out[name] = _full(result[name], (m, width), f"output {name!r}").to(call.out_dtype)
    sink_shape = (m, width)
    for name, sink in epi.sinks.items():
        out[name] = _reduce(name, sink, result[name], call, sink_shape)
    return out
