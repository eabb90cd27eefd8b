"""How many CUDA kernels each host op a candidate's forward() may run launches, as the op log names it.

The CPU's launch estimate (``verifier.trace.LaunchEstimate``) counts one kernel per logged aten op, but some
ops launch several on a GPU (``torch.logsumexp``: an amax, a mask of infinities, a subtraction, an exp, a
sum, a log and an add) and some spellings differ by device (``t[:, i:] = 1.0``). This probe runs each case
on CUDA tensors under the runner's op log and the profiler, and prints, per case, the aten ops the log saw
and the kernels the GPU ran; ``verifier.trace.HOST_OP_LAUNCHES`` is read off its JSON.

    python3 bench/probes/host_op_launches.py --json $OUT/host-op-launches.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from coda_agent.runner.serve import OpLog

M, N = 512, 1024


def cases(dev: str) -> dict[str, Callable[[], object]]:
    x = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    f = x.float()
    v = torch.randn(M, device=dev)
    idx = torch.randint(0, N, (M,), device=dev)
    mask = idx > N // 2

    def setitem_scalar() -> None:
        f[:, :4] = 1.0

    def setitem_tensor() -> None:
        f[:, :4] = v[:, None]

    return {
        "logsumexp": lambda: torch.logsumexp(f, -1),
        "logsumexp_bf16": lambda: torch.logsumexp(x, -1),
        "softmax": lambda: torch.softmax(f, -1),
        "log_softmax": lambda: torch.log_softmax(f, -1),
        "cross_entropy": lambda: F.cross_entropy(f, idx, reduction="none"),
        "cross_entropy_mean": lambda: F.cross_entropy(f, idx),
        "sum": lambda: f.sum(-1),
        "mean": lambda: f.mean(-1),
        "var": lambda: f.var(-1),
        "amax": lambda: f.amax(-1),
        "max_dim": lambda: f.max(-1),
        "norm": lambda: torch.linalg.vector_norm(f, dim=-1),
        "topk": lambda: torch.topk(f, 8, -1),
        "sort": lambda: torch.sort(f, -1),
        "cumsum": lambda: torch.cumsum(f, -1),
        "to_float": lambda: x.float(),
        "to_bf16": lambda: f.to(torch.bfloat16),
        "add": lambda: f + 1.0,
        "add_tensor": lambda: f + v[:, None],
        "rsqrt": lambda: torch.rsqrt(v),
        "exp": lambda: torch.exp(f),
        "where_scalar": lambda: torch.where(mask, v, 0.0),
        "nan_to_num": lambda: torch.nan_to_num(v),
        "clamp": lambda: f.clamp(-1, 1),
        "masked_fill": lambda: v.masked_fill(mask, 0.0),
        "gather": lambda: f.gather(1, idx[:, None]),
        "take_along_dim": lambda: torch.take_along_dim(f, idx[:, None], 1),
        "index_select": lambda: f.index_select(1, idx[:16]),
        "advanced_index": lambda: f[torch.arange(M, device=dev), idx],
        "scatter_add": lambda: torch.zeros_like(f).scatter_add_(1, idx[:, None], f[:, :1]),
        "cat": lambda: torch.cat([f, f], 1),
        "stack": lambda: torch.stack([v, v], 1),
        "contiguous_t": lambda: f.t().contiguous(),
        "clone": lambda: f.clone(),
        "zeros": lambda: torch.zeros(M, N, device=dev),
        "ones": lambda: torch.ones(M, device=dev),
        "full": lambda: torch.full((M,), 2.0, device=dev),
        "empty": lambda: torch.empty(M, N, device=dev),
        "arange": lambda: torch.arange(M, device=dev),
        "tensor_from_list": lambda: torch.tensor([1.0, 2.0], device=dev),
        "fill_scalar": lambda: f.fill_(1.0),
        "setitem_scalar": setitem_scalar,
        "setitem_tensor": setitem_tensor,
        "pad": lambda: F.pad(f, (0, 8)),
        "gelu_tanh": lambda: F.gelu(f, approximate="tanh"),
        "silu": lambda: F.silu(f),
        "pow2": lambda: f.pow(2),
        "item": lambda: v[0].item(),
    }


def probe(dev: str) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, fn in cases(dev).items():
        fn()  # warm: the first call of some ops sets up (cuBLAS handles, cached kernels)
        torch.cuda.synchronize()
        log = OpLog()
        with profile(activities=[ProfilerActivity.CUDA]) as prof, log, log.call():
            fn()
            torch.cuda.synchronize()
        kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy", "Memset"))]
        copies = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                  and e.name.startswith(("Memcpy", "Memset"))]
        out[name] = {"ops": [o["op"] for o in log.calls[-1]], "kernels": len(kernels),
                     "kernel_names": [k[:90] for k in kernels], "copies": copies}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args()
    table = probe("cuda")
    for name, row in table.items():
        print(f"{name:20s} kernels {row['kernels']:2d}  ops {', '.join(row['ops'])}"
              + (f"  copies {row['copies']}" if row["copies"] else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": table},
                      fh, indent=1)


if __name__ == "__main__":
    main()
