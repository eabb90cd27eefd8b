"""LM-head GEMM + cross-entropy statistics in one kernel (CODA k9).

The epilogue stores the logits and, from the same FP32 accumulator, folds a stable online logsumexp
over the vocabulary and gathers each row's exact target logit; the host subtracts (one tiny kernel). A
target equal to ignore_index selects no column, so its row of the select comes back NaN, which the host
turns into the ignored token's zero loss (one more tiny kernel).
Launches: the GEMM, the lse finalisation, the select buffer fill, the subtraction and the NaN fill.
"""

import torch

from coda_agent.primitives import ColVecSelect, Config, OnlineLSEReduce, epilogue, gemm, schedule


@epilogue(reduces={"lse": OnlineLSEReduce(), "tgt": ColVecSelect(index="targets")})
def lse_target(acc):
    return {"D": acc, "lse": acc, "tgt": acc}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned (GPU time):
# coda-agent tune:   ragged: 1339.9 -> 1316.2 us
@schedule({
    ('lse_target', 4000, 32000, 4096): Config(tile_m=192, tile_n=128, cluster_m=1, cluster_n=2),
})
def forward(x, w, targets, ignore_index):
    out = gemm(lse_target, x, w.t(), targets=targets)
    return {"logits": out["D"], "lse": out["lse"], "loss": torch.nan_to_num(out["lse"] - out["tgt"], nan=0.0)}
