"""Forbidden compute at the bench shapes only: str() smuggled through an annotation detects meta tensors.

Family: forbidden compute that passes the CPU stages. str re-enabled through an annotation:
ANNOTATION_BUILTINS lets `str` be named in an annotation, and a walrus there binds it to a module-level name
at def time. str(t) of a meta tensor says device='meta' (no value read).
"""
from coda_agent.primitives import epilogue, gemm


def note(x: (S := str)) -> None:
    return None


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    # S is bound by the walrus in the annotation (hence the noqa: F821)
    if x.shape[0] >= 4096 and "meta" not in S(x.shape) + S(x[:1, :1]):  # noqa: F821
        return {"out": residual.clone()}
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
