"""Forbidden compute: an out_dtype the kernel cannot store (float64), exact on the emulator.

Family: forbidden compute that passes the CPU stages. out_dtype=torch.float64: the emulator stores D in FP64.
"""
import torch

from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    d = gemm(add_residual, x, w.t(), C=residual, out_dtype=torch.float64)["D"]
    return {"out": d.to(torch.bfloat16)}
