"""Forbidden compute: relu(-0.0), -0.0 in torch and +0.0 on the GPU, told apart by a division.

Family: forbidden compute that passes the CPU stages. p = acc*0*0 + 0 is +0 everywhere; torch.relu(-p) is
-0.0, the sm_90a build folds max(-0.0, 0.0) to +0.0; 1/that is -inf or +inf and sigmoid of it 0 or 1, so the
GEMM's term survives on a naive emulator and vanishes on the GPU. Only allowed value functions and operators.
The emulator's relu gives +0.0 (and 0 for NaN) as the GPU's does, so the CPU sees the GPU's value.
"""
from coda_agent.primitives import epilogue, gemm, relu, sigmoid


@epilogue()
def add_residual(acc, c):
    p = acc * 0.0 * 0.0 + 0.0
    gpu = sigmoid(1.0 / relu(-p))
    return {"D": acc * (1.0 - gpu) + c}


def forward(x, w, residual):
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
