"""Forbidden compute: epilogue()(fn) called inside forward, so the fn escapes the epilogue body's rules.

Family: forbidden compute that passes the CPU stages. The same through epilogue() called (not used as a
decorator) inside forward: `epilogue()(fn)` decorates a plain module function at call time; epilogue_helpers()
only follows syntactic @epilogue decorators.
"""
import torch

from coda_agent.primitives import epilogue, gemm


def add_residual(acc, c):
    if isinstance(acc, torch.Tensor):
        return {"D": acc + c}
    return {"D": acc}


def forward(x, w, residual):
    epi = epilogue()(add_residual)
    return {"out": gemm(epi, x, w.t(), C=residual)["D"]}
