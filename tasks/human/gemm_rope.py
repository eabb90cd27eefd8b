"""QKV GEMM + RoPE (CODA k3) in acc_pair mode: each adjacent accumulator pair (2j, 2j+1) is rotated by
theta = position * inv_freq[2j], computed in the epilogue from a column vector (positions) and a row vector
(the per-column frequency table, which arrives paired: its even lane is the pair's frequency)."""

from coda_agent.primitives import ColVecLoad, RowVecLoad, cos, epilogue, gemm, pack, sin, unpack


@epilogue(operands={"positions": ColVecLoad(), "inv_freq": RowVecLoad()}, mode="acc_pair")
def rope(acc, positions, inv_freq):
    x1, x2 = unpack(acc)
    freq, _ = unpack(inv_freq)
    theta = positions * freq
    c, s = cos(theta), sin(theta)
    return {"D": pack(x1 * c - x2 * s, x1 * s + x2 * c)}


def forward(x, w, positions, inv_freq):
    return {"out": gemm(rope, x, w.t(), positions=positions, inv_freq=inv_freq)["D"]}
