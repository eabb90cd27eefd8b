"""GEMM with the deferred RMSNorm row scale (CODA k1): the FP32 accumulator is multiplied by the row's rstd
(a column-vector operand) before the single rounding to bf16."""

from coda_agent.primitives import ColVecLoad, epilogue, gemm


@epilogue(operands={"rstd": ColVecLoad()})
def row_scale(acc, rstd):
    return {"D": acc * rstd}


def forward(x, w, rstd):
    return {"out": gemm(row_scale, x, w.t(), rstd=rstd)["D"]}
