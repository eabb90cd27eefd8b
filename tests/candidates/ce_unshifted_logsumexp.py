"""Bad candidate: cross-entropy whose logsumexp sums exp of the raw logits, with no max subtracted first.

Right on logits of a few units (the ordinary test inputs), but exp overflows FP32 past 88: at large logits lse
comes back Inf and the loss Inf or NaN. A stable kernel keeps a running max (OnlineLSEReduce). It sums
exp(logit) - 1, which is 0 at a partial tile's padding (the emulator refuses a raw exp there), and adds the
vocabulary's ones back on the host.
"""

import torch

from coda_agent.primitives import ColVecReduce, ColVecSelect, epilogue, exp, gemm


@epilogue(reduces={"sumexp": ColVecReduce(), "tgt": ColVecSelect(index="targets")})
def sumexp_target(acc):
    return {"D": acc, "sumexp": exp(acc) - 1.0, "tgt": acc}


def forward(x, w, targets, ignore_index):
    out = gemm(sumexp_target, x, w.t(), targets=targets)
    lse = torch.log(out["sumexp"] + w.shape[0])
    return {"logits": out["D"], "lse": lse, "loss": torch.nan_to_num(lse - out["tgt"], nan=0.0)}
