"""Forbidden compute: host code tells the emulator from the GPU by an output's layout.

Family: forbidden compute that passes the CPU stages. Host code tells the CPU emulator from the GPU (and from
meta) by a result's layout: the emulator returns an extra float32 output that the fn gave as a constant as a
broadcast view (_full: broadcast_to(...).float(), then .to(float32), both no-ops), stride 0 and not
contiguous; QuACK and the shapes backend allocate it densely. Here the GPU then writes fp16 instead of bf16
(same op count, so the compile stage's bench op log agrees).
"""
import torch

from coda_agent.primitives import epilogue, gemm


@epilogue(outputs=("probe",))
def add_residual(acc, c):
    return {"D": acc + c, "probe": 0.0}


def forward(x, w, residual):
    out = gemm(add_residual, x, w.t(), C=residual, out_dtype=torch.float32)
    on_emulator = not out["probe"].is_contiguous()
    dtype = torch.bfloat16 if on_emulator else torch.float16
    return {"out": out["D"].to(dtype)}
