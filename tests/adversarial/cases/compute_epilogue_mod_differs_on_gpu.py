"""Forbidden compute: % in an epilogue, torch.remainder on the emulator and fmod on the GPU.

Family: forbidden compute that passes the CPU stages. A checked @epilogue whose value differs by backend
through the % operator alone: the emulator evaluates torch.remainder (result takes the divisor's sign), QuACK
lowers Float32 % to arith.remf (C fmod: the dividend's sign). For non-integer acc, (acc % 1) + ((-acc) % 1) is
exactly 1 on the emulator and exactly 0 on the GPU.
"""
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    wrong_on_gpu = (acc % 1.0) + ((-acc) % 1.0) - 1.0
    return {"D": acc + c + 1000.0 * wrong_on_gpu}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
