"""RMSNorm backward + residual gradient + dgamma in the epilogue of the dgrad GEMM (CODA k6).

acc = g = dz @ w; C = dres; h is a tile operand; gamma a row vector; rstd and the incoming correction
statistic zdz column vectors. D = dres + rstd * (gamma * g - h * rstd * zdz / N); dgamma folds g * h * rstd
down the columns; the extra output normed = h * rstd * gamma is the consumer's input, recomputed for its
weight gradient. Launches: the GEMM and the dgamma finalisation.
"""

from coda_agent.primitives import ColVecLoad, RowVecLoad, RowVecReduce, epilogue, gemm


@epilogue(
    outputs=("normed",),
    operands={"gamma": RowVecLoad(), "rstd": ColVecLoad(), "zdz": ColVecLoad()},
    reduces={"dgamma": RowVecReduce(scaled=True)},
)
def rms_bwd(acc, c, h, gamma, rstd, zdz, neg_inv_n):
    xhat = h * rstd
    return {"D": (acc * gamma + xhat * (zdz * neg_inv_n)) * rstd + c, "normed": xhat * gamma, "dgamma": (acc, xhat)}


def forward(dz, w, h, gamma, rstd, zdz, dres):
    out = gemm(rms_bwd, dz, w, C=dres, h=h, gamma=gamma, rstd=rstd, zdz=zdz, neg_inv_n=-1.0 / h.shape[1])
    return {"dh": out["D"], "dgamma": out["dgamma"], "normed": out["normed"]}
