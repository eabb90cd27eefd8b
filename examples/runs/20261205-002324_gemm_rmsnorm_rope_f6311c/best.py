"""QKV GEMM + deferred RMSNorm row scale + RoPE (CODA k4), one fused kernel in acc_pair mode.

Each adjacent accumulator pair (2j, 2j+1) is scaled by the row's rstd (FP32) and rotated by
theta = positions[m] * inv_freq[2j]; V columns have zero frequency, so they are only scaled.
"""

from coda_agent.primitives import ColVecLoad, RowVecLoad, cos, epilogue, gemm, pack, sin, unpack


@epilogue(operands={"rstd": ColVecLoad(), "positions": ColVecLoad(), "inv_freq": RowVecLoad()}, mode="acc_pair")
def rmsnorm_rope(acc, rstd, positions, inv_freq):
    a, b = unpack(acc)
    x1 = a * rstd
    x2 = b * rstd
    freq, _ = unpack(inv_freq)
    theta = positions * freq
    c, s = cos(theta), sin(theta)
    return {"D": pack(x1 * c - x2 * s, x1 * s + x2 * c)}


def forward(x, w, rstd, positions, inv_freq):
    out = gemm(rmsnorm_rope, x, w.t(), rstd=rstd, positions=positions, inv_freq=inv_freq)
    return {"out": out["D"]}
