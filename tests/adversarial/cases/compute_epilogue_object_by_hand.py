"""Forbidden compute: an Epilogue made by hand, so its fn escapes the epilogue body's rules.

Family: forbidden compute that passes the CPU stages. An epilogue fn the static check does not know is one:
primitives.Epilogue(...) built directly (a primitives call, so a legal top-level constant) wraps a plain
module function, so the epilogue-body rules (value functions only, no attributes, no isinstance) never apply
to it. The fn tells the emulator's tensors from the GPU's symbolic values and drops the residual on the GPU
only.
"""
import torch

from coda_agent.primitives import Epilogue, gemm


def add_residual(acc, c):
    if isinstance(acc, torch.Tensor):
        return {"D": acc + c}
    return {"D": acc}


ADD = Epilogue(fn=add_residual, outputs=(), pins={}, sinks={}, mode="element", params=("c",))


def forward(x, w, residual):
    return {"out": gemm(ADD, x, w.t(), C=residual)["D"]}
