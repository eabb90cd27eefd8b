"""Over the launch budget (gemm_residual, budget 2): the GEMM plain, the residual add and a "cleanup" on the
host.

Family: forbidden compute / launch budget. The GEMM goes through primitives.gemm, but the fusion the task is
about does not happen: the residual is added by the host, in FP32, with a handful of extra kernels
(casts, add, clamp, cast back). Correct, and well over 2 launches on a GPU.
"""

import torch

from coda_agent.primitives import epilogue, gemm


@epilogue()
def plain(acc):
    return {"D": acc}


def forward(x, w, residual):
    acc = gemm(plain, x, w.t(), out_dtype=torch.float32)["D"]
    out = (acc + residual.float()).clamp(-3.0e38, 3.0e38)
    out = torch.nan_to_num(out).contiguous()
    return {"out": out.to(residual.dtype)}
