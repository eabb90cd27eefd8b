"""QKV GEMM + RoPE (CODA k3) in acc_pair mode: each adjacent accumulator pair (2j, 2j+1) is rotated by
theta = position * inv_freq[2j], computed in the epilogue from a column vector (positions) and a row vector
(the per-column frequency table, which arrives paired: its even lane is the pair's frequency)."""

from coda_agent.primitives import ColVecLoad, Config, RowVecLoad, cos, epilogue, gemm, pack, sin, unpack


#: Re-swept on the H200 after sin/cos moved to the hardware approximation (bench/tuning/h200-2026-11-29-rope.json):
#: a 192x128 pingpong tile with a 1x2 cluster overlaps one warp group's rotation with the other's MMA and beats
#: the 128x256 cooperative tile (chosen for the old, slower sin/cos) by 9.6% (geomean of llama3-8b-qkv,
#: coda-h2048-qkv, coda-h4096-qkv); the 128x192 default is within 0.2% of it.
CONFIG = Config(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2)


@epilogue(operands={"positions": ColVecLoad(), "inv_freq": RowVecLoad()}, mode="acc_pair")
def rope(acc, positions, inv_freq):
    x1, x2 = unpack(acc)
    freq, _ = unpack(inv_freq)
    theta = positions * freq
    c, s = cos(theta), sin(theta)
    return {"D": pack(x1 * c - x2 * s, x1 * s + x2 * c)}


def forward(x, w, positions, inv_freq):
    return {"out": gemm(rope, x, w.t(), positions=positions, inv_freq=inv_freq, config=CONFIG)["D"]}
