"""State across calls: answers cached in a dict nested inside a module-level tuple.

Family: state across calls. A runner that freezes only top-level dicts, lists and sets leaves
``BOX[0]`` writable, and ``BOX[0].get``/``.update`` are allowed methods; the cache key is a value
fingerprint of the inputs.
"""
from coda_agent.primitives import epilogue, gemm

BOX = ({},)


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    key = (tuple(x.shape), round(float(x.float().sum()), 3), round(float(residual.float().sum()), 3))
    hit = BOX[0].get(key)
    if hit is not None:
        return {"out": hit.clone()}
    out = gemm(add_residual, x, w.t(), C=residual)["D"]
    BOX[0].update({key: out})
    return {"out": out}
