"""gemm_swiglu_bwd with the task's statistic as one scaled fold: dgate*gate + dup*up = dout * act * (2 + gate*(1 - s))
with s = sigmoid(gate) (dswiglu's own, which the compiler shares), so the reduce is QuACK's one-fma
``(acc, factor)`` form in place of a two-product value. The same statistic as the human kernel, rounded otherwise."""

from coda_agent.primitives import ColVecReduce, dswiglu, epilogue, gemm, pack, sigmoid, unpack


@epilogue(outputs=("act",), reduces={"zdz": ColVecReduce(scaled=True)}, mode="packed")
def swiglu_bwd(acc, c):
    gate, up = unpack(c)
    dgate, dup, act = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "act": act, "zdz": (acc, act * (2.0 + gate * (1.0 - sigmoid(gate))))}


def forward(dy, w_down, preact):
    out = gemm(swiglu_bwd, dy, w_down, C=preact)
    return {"dpreact": out["D"], "act": out["act"], "zdz": out["zdz"]}
