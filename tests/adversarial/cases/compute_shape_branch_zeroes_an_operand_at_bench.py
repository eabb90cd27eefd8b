"""Forbidden compute at the bench shapes only: the same gemm call everywhere, but its C zeroed at the bench
shapes.

Family: forbidden compute that passes the CPU stages. The epilogue and the GEMM are the same at every shape,
so a check of the gemm calls alone would pass it; at the bench shapes one host op scales the residual by zero
(the task's launch budget of 2 has room for it), so the output is wrong there, where the CPU checks no values.
"""
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    c = residual
    if x.shape[0] >= 4096:
        c = residual * 0.0
    return {"out": gemm(add_residual, x, w.t(), C=c)["D"]}
