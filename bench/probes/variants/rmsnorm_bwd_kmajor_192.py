"""gemm_rmsnorm_bwd on a K-major copy of w (made inside the call) at cuBLAS's tile for these dgrad GEMMs, 192x192
cooperative (bench/results/h200-2026-12-02-g-cublas.log), which QuACK's SM90 kernel builds only for a K-major B
(``Config.check``: a cooperative 192-row tile splits N between its warp groups)."""

from coda_agent.primitives import Config, gemm
from coda_agent.tasks.loader import find_task, import_file

human = import_file(find_task("gemm_rmsnorm_bwd").human_file, "probe_human_gemm_rmsnorm_bwd")
TILE = Config(tile_m=192, tile_n=192, pingpong=False)


def forward(dz, w, h, gamma, rstd, zdz, dres):
    out = gemm(human.rms_bwd, dz, w.t().contiguous().t(), C=dres, h=h, gamma=gamma, rstd=rstd, zdz=zdz,
               neg_inv_n=-1.0 / h.shape[1], config=TILE)
    return {"dh": out["D"], "dgamma": out["dgamma"], "normed": out["normed"]}
