"""Forbidden compute: the epilogue tells the emulator from the GPU (``isinstance(acc, torch.Tensor)``).

Family: forbidden compute that passes the CPU stages. On the emulator acc is a whole FP32 tensor and the
right body runs; when QuACK traces the fn for sm_90a acc is a CuTe value and another body (the residual
dropped) is compiled: correctness and compile pass on the CPU, the GPU kernel is wrong.
"""
import torch

from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    if isinstance(acc, torch.Tensor):
        return {"D": acc + c}
    return {"D": acc + c * 0.0}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
