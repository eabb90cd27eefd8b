"""Forbidden compute: dswiglu at a gate of 1e30, 1 in the textbook form and 0 in QuACK's.

Family: forbidden compute that passes the CPU stages. dgate = dout*up*s*(1 + g*(1-s)) is 1 at g = 1e30;
QuACK computes ((s - silu*s)*dout + silu*dout)*up, where (1 - 1e30) + 1e30 cancels to 0, so the GEMM's term
vanishes on the GPU. The emulator computes dswiglu in QuACK's order with its fused multiply-adds, so the CPU
sees the GPU's value.
"""
from coda_agent.primitives import dswiglu, epilogue, gemm


@epilogue()
def add_residual(acc, c):
    one = dswiglu(acc * 0.0 + 1.0e30, 1.0, 1.0)[0]
    return {"D": acc * one + c}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
