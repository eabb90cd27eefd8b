"""A sparsified activation: every act entry with |act| < TAU is written as 0.

Family: numerically wrong but within a max-abs tolerance (red-team pass 7). Task gemm_rmsnorm_swiglu: about
39% of the down projection's input is dropped. The largest error (0.12) is below the allowed max-abs error
(0.30), which the eager reference's bf16 rounding of values up to ~29 sets; the error's L1 norm is several
times the eager reference's.
"""

from coda_agent.primitives import ColVecLoad, epilogue, gemm, maximum, minimum, pack, relu, swiglu, unpack

TAU = 0.12


@epilogue(outputs=("act",), operands={"rstd": ColVecLoad()}, mode="acc_pair")
def norm_gated_sparse(acc, rstd):
    gate, up = unpack(acc * rstd)
    a = swiglu(gate, up)
    keep = minimum(relu(maximum(a, -a) - TAU) * 1.0e9, 1.0)
    return {"D": pack(gate, up), "act": a * keep}


def forward(x, w, rstd):
    out = gemm(norm_gated_sparse, x, w.t(), rstd=rstd)
    return {"act": out["act"], "preact": out["D"]}
