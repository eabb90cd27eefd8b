"""Forbidden compute: %= in an epilogue (remainder on the emulator, fmod on the GPU).

Family: forbidden compute that passes the CPU stages. % through augmented assignment in an epilogue: the third
pass refused `acc % 1.0` (BinOp), but `y %= 1.0` (AugAssign) is not held to EPILOGUE_OPERATORS. Emulator:
torch.remainder (divisor's sign); GPU: fmod.
"""
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    a = acc + 0.0
    a %= 1.0
    b = -acc
    b %= 1.0
    wrong_on_gpu = a + b - 1.0
    return {"D": acc + c + 1000.0 * wrong_on_gpu}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
