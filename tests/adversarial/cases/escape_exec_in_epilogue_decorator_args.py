"""Sandbox escape: exec run at import from the arguments of @epilogue(...).

Family: sandbox escapes. Same scoping hole through @epilogue(...)'s arguments (also evaluated at module
scope).
"""
from coda_agent.primitives import epilogue, gemm


@epilogue(outputs=[0 for v in (1,) if exec("print('exec from a decorator argument')") or (exec := 0)] and ())
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
