"""The constrained primitive API candidates (human or LLM) write kernels against.

A candidate declares an epilogue over the FP32 accumulator of a GEMM and calls it::

    from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum

    @epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
    def residual_norm(acc, c, gamma):
        y = acc + c
        return {"D": y * gamma, "h": y, "sqsum": (y, y)}

    def forward(x, w, residual, gamma):
        out = gemm(residual_norm, x, w.t(), C=residual, gamma=gamma)
        return {"h": out["h"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], 1e-6)}

The same code runs on the torch emulator (CPU) and as a QuACK kernel (GPU); the harness chooses.
"""

from ._epilogue import Config, Epilogue, EpilogueError, epilogue, gemm
from ._ops import ColVecLoad, ColVecReduce, ColVecSelect, OnlineLSEReduce, RowVecLoad, RowVecReduce
from ._values import (
    cos,
    dswiglu,
    exp,
    gelu_tanh,
    log,
    maximum,
    minimum,
    pack,
    relu,
    rsqrt,
    sigmoid,
    silu,
    sin,
    sqrt,
    swiglu,
    tanh,
    unpack,
)
from .host import rstd_correction, rstd_from_sqsum

__all__ = [
    "ColVecLoad",
    "ColVecReduce",
    "ColVecSelect",
    "Config",
    "Epilogue",
    "EpilogueError",
    "OnlineLSEReduce",
    "RowVecLoad",
    "RowVecReduce",
    "cos",
    "dswiglu",
    "epilogue",
    "exp",
    "gelu_tanh",
    "gemm",
    "log",
    "maximum",
    "minimum",
    "pack",
    "relu",
    "rsqrt",
    "rstd_correction",
    "rstd_from_sqsum",
    "sigmoid",
    "silu",
    "sin",
    "sqrt",
    "swiglu",
    "tanh",
    "unpack",
]
