"""State across calls in a module-level Pair: it remembers whether this runner has seen a small shape.

Family: state across calls. A top-level constant may call a declaration primitive; ``pack`` is a value
function whose Pair holds two mutable lists, which freezing the module's dicts, lists and sets does not reach.
The CPU runners call forward() at a small shape first, so there it is honest; a runner whose first call is at
a bench shape (the GPU stages) returns the residual and runs no GEMM.
"""
from coda_agent.primitives import epilogue, gemm, pack, unpack

SEEN = pack([], [])


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    small = unpack(SEEN)[0]
    if x.shape[0] < 4096:
        small.append(1)
    if len(small) == 0:
        return {"out": residual.clone()}
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
