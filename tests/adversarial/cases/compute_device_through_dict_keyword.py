"""Forbidden compute on the GPU only: host code learns where it runs from ``dict(device=x.device)``.

Family: forbidden compute that passes the CPU stages. A rule that lets ``.device`` be read as any call's
``device=`` keyword hands the device object to host code; compared with a CPU and a meta device it tells the
emulator, the compile stage's meta run and a real GPU apart, and the GPU-only branch is never checked on the
CPU.
"""
import torch

from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    here = dict(device=x.device)
    on_cpu = here == dict(device=torch.empty_like(x[:0, :0], device="cpu").device)
    on_meta = here == dict(device=torch.empty_like(x[:0, :0], device="meta").device)
    out = gemm(add_residual, x, w.t(), C=residual)["D"]
    # only on the H200: value-dependent behaviour and host work neither CPU stage saw
    if not on_cpu and not on_meta and float(x[0, 0]) > 0.0:
        for _ in range(8):
            out = out.clone()
    return {"out": out}
