"""A constant index of an operand inside an epilogue: gamma[0] is the whole row on the emulator, which holds a
row vector as a (1, N) tensor, and no value on the GPU, whose build fails.

Family: a CPU stage accepting what the GPU refuses (a red-team pass). The constant-index rule is for the
tuples value functions return (dswiglu's); a parameter is one value per element.
"""
from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum


@epilogue(operands={"gamma": RowVecLoad()}, outputs=("h",), reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"h": h, "D": h * gamma[0], "sqsum": (h, h)}


def forward(x, w, residual, gamma, eps):
    out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
    return {"h": out["h"], "normed": out["D"], "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
