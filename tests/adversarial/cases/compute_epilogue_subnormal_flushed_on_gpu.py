"""Forbidden compute: a subnormal exp, kept by the emulator's torch and flushed to 0 on the GPU.

Family: forbidden compute that passes the CPU stages. exp(-88) = 6.05e-39 is subnormal: torch.exp keeps it, so
on a naive emulator the term below is 1.0 and cancels the 1.0 beside it (D = acc + c); the GPU's exp is
ex2.approx.ftz (MUFU.EX2), which flushes it to 0, so D = acc + c + 1 at every element. Only + - * and exp: no
operator the static check refuses. The emulator flushes as the GPU does, so the CPU sees the GPU's value.
"""
from coda_agent.primitives import epilogue, exp, gemm


@epilogue()
def add_residual(acc, c):
    tiny = exp(acc * 0.0 - 88.0)
    return {"D": acc + c + (1.0 - tiny * 1.6516363668939903e19 * 1.0e19)}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
