"""State across calls: the Epilogue's backend_cache dict, reached through a parameter named math.

Family: state across calls. State across calls: the Epilogue object's backend_cache dict, reached through a
`math`-named parameter (freeze_globals freezes only plain containers, not the Epilogue), counts forward()
calls.
"""


from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def box(math):
    return math.backend_cache


def forward(x, w, residual):
    state = box(add_residual)
    n = state.get("calls", 0) + 1
    state.update({"calls": n})
    out = gemm(add_residual, x, w.t(), C=residual)["D"]
    if n == 7:
        raise ValueError("call number " + str(n) + " remembers " + str(sorted(state.keys())))
    return {"out": out}
