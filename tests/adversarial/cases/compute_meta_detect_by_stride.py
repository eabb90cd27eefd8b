"""Skips the GEMM on real tensors at the bench sizes, honest on the small shapes and on every meta run.

Family: forbidden compute that passes the CPU stages (a red-team pass). The tell: torch.empty_like of a (K, 1)
slice of x.t() keeps strides (1, K) on real tensors and gets (1, 1) on meta ones (a size-1 dimension's
stride); empty_like launches nothing, so the probe costs no launch and adds no kind of work. Refused since
.stride() left the allowlist.
"""
import torch

from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    probe = torch.empty_like(x.t()[:, :1])
    real = probe.stride()[1] != 1
    if real and x.shape[0] >= 4096:
        return {"out": residual.clone()}
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
