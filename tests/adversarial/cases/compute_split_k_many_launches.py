"""Over the launch budget: split K into 8 primitives.gemm calls and sum the partial products on the host.

Family: forbidden compute / launch budget. Every GEMM goes through primitives.gemm, but as 8 kernels plus
host adds and a host RMS statistic, far over the task's budget of 4 launches; on the CPU nothing counts.
"""

import torch

from coda_agent.primitives import epilogue, gemm


@epilogue()
def passthrough(acc):
    return {"D": acc}


def forward(x, w, residual, gamma, eps):
    k = x.shape[1]
    step = (k + 7) // 8
    acc = residual.float()
    for lo in range(0, k, step):
        acc = (acc
               + gemm(passthrough, x[:, lo : lo + step], w[:, lo : lo + step].t(),
                      out_dtype=torch.float32)["D"])
    h = acc.to(residual.dtype)
    return {"h": h, "normed": h * gamma, "rstd": torch.rsqrt(acc.pow(2).mean(-1) + eps)}
