"""State across calls: answers cached by a cheap fingerprint of the input values (module-level dict).

Family: state across calls. A fingerprint (a few sums and corner elements of every input) keys a
module-level dict; a call whose inputs were seen before returns the stored answer without any GEMM. Every
correctness call of a naive harness uses fresh values, so the cache never hits there and the candidate
"passes"; every timed repetition reuses the same inputs, so the profile times a dict lookup.
"""


from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, rstd_from_sqsum

ANSWERS = {}


@epilogue(outputs=("h",), operands={"gamma": RowVecLoad()}, reduces={"sqsum": ColVecReduce(scaled=True)})
def residual_rms(acc, c, gamma):
    h = acc + c
    return {"D": h * gamma, "h": h, "sqsum": (h, h)}


def _fingerprint(*tensors):
    key = []
    for t in tensors:
        f = t.float()
        key += [tuple(t.shape), round(float(f.sum()), 3), round(float(f.reshape(-1)[0]), 4),
                round(float(f.reshape(-1)[-1]), 4)]
    return tuple(key)


def forward(x, w, residual, gamma, eps):
    key = _fingerprint(x, w, residual, gamma)
    if key not in ANSWERS:
        out = gemm(residual_rms, x, w.t(), C=residual, gamma=gamma)
        ANSWERS[key] = {"h": out["h"], "normed": out["D"],
                        "rstd": rstd_from_sqsum(out["sqsum"], w.shape[0], eps)}
    return {k: v.clone() for k, v in ANSWERS[key].items()}
