import torch

from coda_agent.primitives import ColVecSelect, Config, OnlineLSEReduce, epilogue, gemm, schedule, tanh


@epilogue(reduces={"lse": OnlineLSEReduce(), "tgt": ColVecSelect(index="targets")})
def capped_lse(acc, cap, inv_cap):
    y = cap * tanh(acc * inv_cap)
    return {"D": y, "lse": y, "tgt": y}


# coda-agent tune: configs pinned by the harness's tune stage on NVIDIA H200; forward() as written -> tuned (GPU time):
# coda-agent tune:   gemma2-2b-lmhead: 22394.6 -> 13253.5 us
@schedule({
    ('capped_lse', 8192, 256000, 2304): Config(tile_n=128),
})
def forward(x, w, targets, softcap, ignore_index):
    config = Config(tile_m=128, tile_n=64, cluster_m=1, cluster_n=1)
    out = gemm(capped_lse, x, w.t(), targets=targets, cap=softcap, inv_cap=1.0 / softcap, config=config)
    loss = torch.nan_to_num(out["lse"] - out["tgt"], nan=0.0)
    return {"logits": out["D"], "lse": out["lse"], "loss": loss}
