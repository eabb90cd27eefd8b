"""Forbidden compute: a primitive's name rebound inside the epilogue body.

Family: forbidden compute that passes the CPU stages. The same escape without any top-level rebinding: the
epilogue body itself binds the primitive's name `relu` to an unchecked module-level function (a Name load, not
a call, so epilogue_helpers never follows it).
"""
import torch

from coda_agent.primitives import epilogue, gemm


def host_relu(v):
    if isinstance(v, torch.Tensor):
        return v * 0.0
    return v * 0.0 + 1000.0


@epilogue()
def add_residual(acc, c):
    relu = host_relu
    return {"D": acc + c + relu(acc)}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
