"""Cross-entropy backward of the LM head in the epilogue of a GEMM that recomputes the logits (after CODA k5).

The epilogue scales the FP32 accumulator by rstd (the logits), takes the softmax from the forward's lse,
subtracts the one-hot of the target and scales by the token's loss gradient, and folds dlogits * logits
into the row statistic zdz. The epilogue sees no column coordinate, so the one-hot comes from operands:
a row vector of column numbers and a column vector of targets, both exact in FP32 (V < 2**24); for whole
numbers d = column - target, relu(1 - d * d) is 1 at the target and 0 elsewhere. Ignored rows get a zero
scale, which zeroes their dlogits and zdz. Launches: 4 tiny host ops, the GEMM and the zdz finalisation.
"""

import torch

from coda_agent.primitives import ColVecLoad, ColVecReduce, RowVecLoad, epilogue, exp, gemm, relu


@epilogue(
    operands={"rstd": ColVecLoad(), "lse": ColVecLoad(), "scale": ColVecLoad(), "target": ColVecLoad(), "column": RowVecLoad()},
    reduces={"zdz": ColVecReduce(scaled=True)},
)
def softmax_grad(acc, rstd, lse, scale, target, column):
    logits = acc * rstd
    d = column - target
    dlogits = scale * (exp(logits - lse) - relu(1.0 - d * d))
    return {"D": dlogits, "zdz": (dlogits, logits)}


def forward(x, w, rstd, targets, lse, dloss, ignore_index):
    scale = dloss * (targets != ignore_index)
    column = torch.arange(w.shape[0], dtype=torch.float32, device=x.device)
    out = gemm(softmax_grad, x, w.t(), rstd=rstd, lse=lse, scale=scale, target=targets.float(), column=column)
    return {"dlogits": out["D"], "zdz": out["zdz"]}
