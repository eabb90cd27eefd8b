"""SiLU replaced by a cheap rational approximation (sigmoid from a clamped Pade tanh, no exp).

Family: numerically wrong but within a max-abs tolerance (red-team pass 7). Task gemm_rmsnorm_swiglu: act is
off by up to 0.28 against an allowed max-abs error of 0.31, nearly everywhere; the error's L1 norm is 1.8x
what the max-abs rule's factor allows of the eager reference's.
"""

from coda_agent.primitives import ColVecLoad, epilogue, gemm, maximum, minimum, pack, unpack


@epilogue(outputs=("act",), operands={"rstd": ColVecLoad()}, mode="acc_pair")
def norm_gated_pade(acc, rstd):
    gate, up = unpack(acc * rstd)
    y = gate * 0.5
    t = minimum(maximum(y * (27.0 + y * y) / (27.0 + 9.0 * y * y), -1.0), 1.0)
    return {"D": pack(gate, up), "act": gate * (0.5 + 0.5 * t) * up}


def forward(x, w, rstd):
    out = gemm(norm_gated_pade, x, w.t(), rstd=rstd)
    return {"act": out["act"], "preact": out["D"]}
