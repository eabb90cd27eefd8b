"""gemm_swiglu_bwd with the task's statistic as two scaled folds: zdz = dgate*gate + dup*up, and dup*up = dout*act,
so one fold is QuACK's dgated (act, acc) and the other (dgate, gate); the host adds the two row sums. The same
statistic as the human kernel, for the SASS and GPU comparison of the reduce's cost; not a candidate: its second
finalisation and the add take it over the task's launch budget (4 kernels against 2)."""

from coda_agent.primitives import ColVecReduce, dswiglu, epilogue, gemm, pack, unpack


@epilogue(outputs=("act",), reduces={"zdz_up": ColVecReduce(scaled=True), "zdz_gate": ColVecReduce(scaled=True)},
          mode="packed")
def swiglu_bwd(acc, c):
    gate, up = unpack(c)
    dgate, dup, act = dswiglu(gate, up, acc)
    return {"D": pack(dgate, dup), "act": act, "zdz_up": (act, acc), "zdz_gate": (dgate, gate)}


def forward(dy, w_down, preact):
    out = gemm(swiglu_bwd, dy, w_down, C=preact)
    return {"dpreact": out["D"], "act": out["act"], "zdz": out["zdz_up"] + out["zdz_gate"]}
