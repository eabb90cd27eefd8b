"""LM head with the final RMSNorm's deferred row scale + cross-entropy statistics, in one GEMM (CODA k5).

logits = rstd * acc in FP32 in the epilogue; it is stored (bf16), folded into an online logsumexp over the
vocabulary and gathered at each row's target. loss = lse - logit[target] on the host; ignored rows (NaN from
the select) become 0.
"""

import torch

from coda_agent.primitives import ColVecLoad, ColVecSelect, OnlineLSEReduce, epilogue, gemm


@epilogue(operands={"rstd": ColVecLoad()}, reduces={"lse": OnlineLSEReduce(), "picked": ColVecSelect(index="targets")})
def scaled_lse_target(acc, rstd):
    logits = acc * rstd
    return {"D": logits, "lse": logits, "picked": logits}


def forward(x, w, rstd, targets, ignore_index):
    out = gemm(scaled_lse_target, x, w.t(), rstd=rstd, targets=targets)
    loss = torch.nan_to_num(out["lse"] - out["picked"], nan=0.0)
    return {"logits": out["D"], "lse": out["lse"], "loss": loss}
