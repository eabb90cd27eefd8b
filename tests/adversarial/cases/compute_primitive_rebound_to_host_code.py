"""Forbidden compute: a primitive's name rebound to host code that tells the emulator from the GPU.

Family: forbidden compute that passes the CPU stages. A primitives value function rebound at top level to a
host function: the static check trusts the imported name (primitive_aliases) and never sees that `relu` now
names host_relu, so the epilogue escapes every epilogue rule (isinstance, if, attributes, any allowed torch
call) and tells the emulator from the GPU's trace.
"""
import torch

from coda_agent.primitives import epilogue, gemm, relu


def host_relu(v):
    if isinstance(v, torch.Tensor):   # the emulator's whole-tile tensors
        return v * 0.0
    return v * 0.0 + 1000.0           # the GPU's symbolic Float32: traced and built fine, wrong by 1000


relu = host_relu  # noqa: F811 (the rebinding is the attack)


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c + relu(acc)}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
