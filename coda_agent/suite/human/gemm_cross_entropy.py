"""LM-head GEMM + cross-entropy statistics in one kernel (CODA k9).

The epilogue stores the logits and, from the same FP32 accumulator, folds a stable online logsumexp
over the vocabulary and gathers each row's exact target logit; the host subtracts (one tiny kernel).
Launches: the GEMM, the lse finalisation, the select buffer fill and the subtraction.
"""

from coda_agent.primitives import ColVecSelect, OnlineLSEReduce, epilogue, gemm


@epilogue(reduces={"lse": OnlineLSEReduce(), "tgt": ColVecSelect(index="targets")})
def lse_target(acc):
    return {"D": acc, "lse": acc, "tgt": acc}


def forward(x, w, targets):
    out = gemm(lse_target, x, w.t(), targets=targets)
    return {"logits": out["D"], "lse": out["lse"], "loss": out["lse"] - out["tgt"]}
