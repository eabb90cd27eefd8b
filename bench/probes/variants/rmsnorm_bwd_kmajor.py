"""gemm_rmsnorm_bwd as the human kernel writes it, fed a K-major copy of w made inside the call (so timed with it):
the layout ``Kernels(k_major_dgrad=True)`` gives the Llama stack's dgrad GEMMs (issue 45, item 2). The human
kernel's own config."""

from coda_agent.tasks.loader import find_task, import_file

human = import_file(find_task("gemm_rmsnorm_bwd").human_file, "probe_human_gemm_rmsnorm_bwd")


def forward(dz, w, h, gamma, rstd, zdz, dres):
    return human.forward(dz, w.t().contiguous().t(), h, gamma, rstd, zdz, dres)
