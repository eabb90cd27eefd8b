"""float() of a scalar operand inside an epilogue: the emulator reads the 0-d tensor to a Python number, the
GPU's value is symbolic and the build fails.

Family: a CPU stage accepting what the GPU refuses (a red-team pass). float and int take numbers the module
fixes (literals, math of literals, module constants), never a value.
"""
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c, one):
    return {"D": acc * float(one) + c}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual, one=1.0)["D"]}
