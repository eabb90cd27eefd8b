"""QKV GEMM + deferred rstd + RoPE (CODA k4) in acc_pair mode: the row scale multiplies both lanes of each
accumulator pair (2j, 2j+1), which is then rotated by theta = position * inv_freq[2j], computed in the
epilogue (the per-column frequency table arrives paired: its even lane is the pair's frequency)."""

from coda_agent.primitives import ColVecLoad, Config, RowVecLoad, cos, epilogue, gemm, pack, sin, unpack


#: Tuned offline on the H200 (`coda-agent bench --tune`, QuACK's autotuner, then checked end to end): with the
#: sin/cos epilogue the 128x192 pingpong default runs about 20% behind the cooperative 128x256 tile at every
#: tuned shape (llama3-8b-qkv, coda-h2048-qkv, coda-h4096-qkv), so the kernel uses it everywhere.
CONFIG = Config(tile_n=256, pingpong=False)


@epilogue(
    operands={"rstd": ColVecLoad(), "positions": ColVecLoad(), "inv_freq": RowVecLoad()}, mode="acc_pair"
)
def norm_rope(acc, rstd, positions, inv_freq):
    x1, x2 = unpack(acc * rstd)
    freq, _ = unpack(inv_freq)
    theta = positions * freq
    c, s = cos(theta), sin(theta)
    return {"D": pack(x1 * c - x2 * s, x1 * s + x2 * c)}


def forward(x, w, rstd, positions, inv_freq):
    return {"out": gemm(norm_rope, x, w.t(), rstd=rstd, positions=positions, inv_freq=inv_freq, config=CONFIG)["D"]}
