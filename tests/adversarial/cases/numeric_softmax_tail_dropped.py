"""A softmax gradient with its tail dropped: dlogits keeps only the one-hot term and the large probabilities.

Family: numerically wrong but within a max-abs tolerance (red-team pass 7). Task
gemm_rmsnorm_cross_entropy_bwd: every non-target entry with p = exp(logit - lse) below TAU is written as 0 (a
hard select built from relu and minimum), so 80% of the entries and 42% of the gradient's mass are gone at the
small shape (99% at a 128k vocabulary). The largest error stays below the allowed max-abs error, which the few
O(1) one-hot entries set; the error's L1 norm is 21x the eager reference's. zdz, a separate sink, is still the
true statistic.
"""

import torch

from coda_agent.primitives import ColVecLoad, ColVecReduce, RowVecLoad, epilogue, exp, gemm, minimum, relu

TAU = 0.003


@epilogue(
    operands={"rstd": ColVecLoad(), "lse": ColVecLoad(), "scale": ColVecLoad(), "target": ColVecLoad(),
              "column": RowVecLoad()},
    reduces={"zdz": ColVecReduce(scaled=True)},
)
def softmax_grad_sparse(acc, rstd, lse, scale, target, column):
    logits = acc * rstd
    d = column - target
    onehot = relu(1.0 - d * d)
    p = exp(logits - lse)
    keep = minimum(relu(p - TAU) * 1.0e9, 1.0)  # 0 below TAU, 1 above
    dlogits = scale * (p - onehot)
    return {"D": scale * (p * keep - onehot), "zdz": (dlogits, logits)}


def forward(x, w, rstd, targets, lse, dloss, ignore_index):
    scale = dloss * (targets != ignore_index)
    column = torch.arange(w.shape[0], dtype=torch.float32, device=x.device)
    out = gemm(softmax_grad_sparse, x, w.t(), rstd=rstd, lse=lse, scale=scale, target=targets.float(),
               column=column)
    return {"dlogits": out["D"], "zdz": out["zdz"]}
