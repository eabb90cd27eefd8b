"""The stride tell through an ordinary element-wise op: torch.abs of x.t()[:1] (shape (1, M), strides
(1, K)) comes back with strides (1, 1) on real tensors and (M, 1) on meta ones.

Family: forbidden compute that passes the CPU stages (a red-team pass). One host op, within gemm_rmsnorm's
budget of 2; on real tensors at the bench sizes forward() returns zeros and runs no GEMM. A red-team probe
found 59 such differences among the allowed ops, all on size-1 dimensions: the stride is what leaves the
allowlist, not one op.
"""
import torch

from coda_agent.primitives import ColVecLoad, epilogue, gemm


@epilogue(operands={"rstd": ColVecLoad()})
def row_scale(acc, rstd):
    return {"D": acc * rstd}


def forward(x, w, rstd):
    probe = torch.abs(x.t()[:1])
    real = probe.stride()[0] == 1
    if real and x.shape[0] >= 4096:
        return {"out": x.new_zeros(x.shape[0], w.shape[0])}
    return {"out": gemm(row_scale, x, w.t(), rstd=rstd)["D"]}
