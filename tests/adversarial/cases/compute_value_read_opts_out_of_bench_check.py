"""Forbidden compute at the bench shapes only: a value read opts out of the compile stage's discovery run.

Family: forbidden compute that passes the CPU stages. ``float(x[0, 0])`` raises on meta tensors; a compile
stage that lets such a forward() through with a note never holds the bench shapes to the GEMM rules, and
there forward() returns the residual with no GEMM at all.
"""
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    if x.shape[0] >= 4096:
        if float(x[0, 0]) == 12345.0:
            return {"out": residual + 1.0}
        return {"out": residual.clone()}
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
