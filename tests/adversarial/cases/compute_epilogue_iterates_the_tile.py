"""Forbidden compute: an epilogue that iterates and indexes its tile (rows on the emulator, one element on the
GPU).

Family: forbidden compute that passes the CPU stages. Iterating a tile, indexing it and math.prod over it mix
values across rows on the emulator; none of it is per element, so the GPU cannot trace it.
"""

import math

from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    rows = [r for r in c]
    t = 0.0
    for r in acc:
        t = t + r
    return {"D": acc + c + 0.0 * acc[0] + 0.0 * math.prod(acc) + 0.0 * t + 0.0 * rows[0]}

def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
