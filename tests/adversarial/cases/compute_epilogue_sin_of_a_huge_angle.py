"""Forbidden compute: sin(2**100), -0.87 by torch's exact reduction and 0 by the GPU's reduction in turns.

Family: forbidden compute that passes the CPU stages. On the GPU sin(x) is sin.approx of (t - round(t)) * 2pi
with t = x / 2pi; at x = 2**100 t is an integer, so the reduced angle is 0, `one` is 0 and the GEMM's term
vanishes. The emulator reduces in turns with the same roundings (ptxas's fused x / 2pi), so the CPU sees the
GPU's value.
"""
from coda_agent.primitives import epilogue, gemm, minimum, sin


@epilogue()
def add_residual(acc, c):
    s = sin(acc * 0.0 + 1.2676506002282294e30)
    one = minimum(s * s * 1.0e6, 1.0)
    return {"D": acc * one + c}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
