"""LM-head GEMM + deferred RMSNorm row scale + cross-entropy statistics in one kernel (CODA k5).

The epilogue scales the FP32 accumulator by rstd (a column vector), stores the logits, folds a stable
online logsumexp over the vocabulary and gathers each row's exact target logit; the host subtracts.
Launches: the GEMM, the lse finalisation, the select buffer fill and the subtraction.
"""

from coda_agent.primitives import ColVecLoad, ColVecSelect, OnlineLSEReduce, epilogue, gemm


@epilogue(
    operands={"rstd": ColVecLoad()},
    reduces={"lse": OnlineLSEReduce(), "tgt": ColVecSelect(index="targets")},
)
def rstd_lse_target(acc, rstd):
    logits = acc * rstd
    return {"D": logits, "lse": logits, "tgt": logits}


def forward(x, w, rstd, targets):
    out = gemm(rstd_lse_target, x, w.t(), rstd=rstd, targets=targets)
    return {"logits": out["D"], "lse": out["lse"], "loss": out["lse"] - out["tgt"]}
