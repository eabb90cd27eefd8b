"""QKV GEMM + deferred rstd + RoPE (CODA k4) in acc_pair mode: the row scale multiplies both lanes of each
accumulator pair (2j, 2j+1), which is then rotated by theta = position * inv_freq[2j], computed in the
epilogue (the per-column frequency table arrives paired: its even lane is the pair's frequency)."""

from coda_agent.primitives import ColVecLoad, Config, RowVecLoad, cos, epilogue, gemm, pack, sin, unpack


#: Re-swept on the H200 after sin/cos moved to the hardware approximation (bench/tuning/h200-2026-11-29-rope.json):
#: a 192x128 pingpong tile with a 1x2 cluster overlaps one warp group's rotation with the other's MMA and beats
#: the 128x256 cooperative tile (chosen for the old, slower sin/cos) by 9.6% (geomean of llama3-8b-qkv,
#: coda-h2048-qkv, coda-h4096-qkv); the 128x192 default is within 0.2% of it.
CONFIG = Config(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2)


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
