"""Forbidden compute: silu(-inf), 0 on a flushing emulator and NaN on the GPU, told apart by maximum.

Family: forbidden compute that passes the CPU stages. QuACK's silu is x * rcp(1 + ex2(-x log2 e)): -inf * 0 is
NaN, and the GPU's max returns its non-NaN operand, so `off` is -1 there and the GEMM's term vanishes; an
emulator that computes silu otherwise (or whose max propagates NaN) sees another value. The emulator computes
silu as QuACK does and its maximum as max.f32 (torch.fmax), so the CPU sees the GPU's value.
"""
from coda_agent.primitives import epilogue, gemm, maximum, silu


@epilogue()
def add_residual(acc, c):
    off = maximum(silu(acc * 0.0 - 1.0e39), -1.0)
    return {"D": acc * (1.0 + off) + c}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
