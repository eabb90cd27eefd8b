"""Forbidden compute at the bench shapes only: forward() recognises the compile stage's meta tensors.

Family: forbidden compute that passes the CPU stages. ``str(x.device) != "meta"`` is honest during the
discovery run on meta tensors; on real tensors of bench size it skips the GEMM, which no CPU stage runs.
"""
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    if x.shape[0] >= 4096 and str(x.device) != "meta":
        return {"out": residual.clone()}
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
