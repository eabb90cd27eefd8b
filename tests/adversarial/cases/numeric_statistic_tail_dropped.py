"""A statistic with its tail dropped: zdz leaves out every column whose logit is below CUT (red-team pass 8).

Family: numerically wrong but within a max-abs tolerance. Task gemm_rmsnorm_cross_entropy_bwd: dlogits is
exact, but a third of the columns are missing from zdz = sum_v dlogits * logits. zdz is FP32, and the L1/L2
rule of the seventh pass held only 16-bit outputs; its max-abs bound is set by the few rows with large |zdz|.
The error's L1 norm is 3.7-5.9x the eager reference's; every floating-point output is held to its error norms
now.
"""

import torch

from coda_agent.primitives import (
    ColVecLoad,
    ColVecReduce,
    RowVecLoad,
    epilogue,
    exp,
    gemm,
    maximum,
    minimum,
    relu,
)

CUT = -0.5


@epilogue(
    operands={"rstd": ColVecLoad(), "lse": ColVecLoad(), "scale": ColVecLoad(), "target": ColVecLoad(),
              "column": RowVecLoad()},
    reduces={"zdz": ColVecReduce(scaled=True)},
)
def softmax_grad(acc, rstd, lse, scale, target, column):
    logits = acc * rstd
    d = column - target
    onehot = relu(1.0 - d * d)
    dlogits = scale * (exp(logits - lse) - onehot)
    keep = maximum(minimum(relu(logits - CUT) * 1.0e9, 1.0), onehot)  # 1 above CUT or at the target, else 0
    return {"D": dlogits, "zdz": (dlogits, logits * keep)}


def forward(x, w, rstd, targets, lse, dloss, ignore_index):
    scale = dloss * (targets != ignore_index)
    column = torch.arange(w.shape[0], dtype=torch.float32, device=x.device)
    out = gemm(softmax_grad, x, w.t(), rstd=rstd, lse=lse, scale=scale, target=targets.float(), column=column)
    return {"dlogits": out["D"], "zdz": out["zdz"]}
