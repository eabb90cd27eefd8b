"""Garbage C at the bench shapes only: the same gemm call everywhere, its C a torch.empty_like at the bench
sizes.

Family: forbidden compute that passes the CPU stages (a red-team pass). Unlike zeroing C (a host op: one more
kind of work), empty_like launches nothing, so every shape ran the same kinds of work; the GPU would compute
on whatever the allocator left. The op log refuses a gemm call that reads memory no op wrote.
"""
import torch

from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    c = residual
    if x.shape[0] >= 4096:
        c = torch.empty_like(residual)
    return {"out": gemm(add_residual, x, w.t(), C=c)["D"]}
