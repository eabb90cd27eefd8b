"""Forbidden compute at the bench shapes only: forward() branches on the shape, honestly, on every device.

Family: forbidden compute that passes the CPU stages. At the small shapes (the only ones whose values the CPU
checks) it adds the residual; from M 4096 up (every bench shape) it runs a cheaper epilogue with no C read.
The branch reads no device and keeps no state, so the meta run at the bench shapes sees one GEMM of the right
shape and FLOPs; only the kinds of work differ between the shapes.
"""
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


@epilogue()
def plain(acc):
    return {"D": acc}


def forward(x, w, residual):
    if x.shape[0] >= 4096:
        return {"out": gemm(plain, x, w.t())["D"]}
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
