"""LM-head GEMM + deferred RMSNorm row scale + cross-entropy statistics in one kernel (CODA k5).

The epilogue scales the FP32 accumulator by rstd (a column vector), stores the logits, folds a stable
online logsumexp over the vocabulary and gathers each row's exact target logit; the host subtracts. A
target equal to ignore_index selects no column, so its row of the select comes back NaN, which the host
turns into the ignored token's zero loss.
Launches: the GEMM, the lse finalisation, the select buffer fill, the subtraction and the NaN fill.
"""

import torch

from coda_agent.primitives import ColVecLoad, ColVecSelect, OnlineLSEReduce, epilogue, gemm


@epilogue(
    operands={"rstd": ColVecLoad()},
    reduces={"lse": OnlineLSEReduce(), "tgt": ColVecSelect(index="targets")},
)
def rstd_lse_target(acc, rstd):
    logits = acc * rstd
    return {"D": logits, "lse": logits, "tgt": logits}


def forward(x, w, rstd, targets, ignore_index):
    out = gemm(rstd_lse_target, x, w.t(), rstd=rstd, targets=targets)
    return {"logits": out["D"], "lse": out["lse"], "loss": torch.nan_to_num(out["lse"] - out["tgt"], nan=0.0)}
