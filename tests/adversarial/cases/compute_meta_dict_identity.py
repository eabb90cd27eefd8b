"""Tells meta tensors apart with no `is` and no device string assigned (red-team pass 8).

Family: forbidden compute that passes the CPU stages, like compute_meta_identity_skips_bench_gemm: the
device's name comes back from a helper's return value, so no string is assigned to the name given to `.to()`,
and identity is tested by a dict lookup (tensors hash by id). Refused since: a device must be an attribute
(`x.device`) or a name bound only to one.
"""
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def where_meta():
    return "meta"


def forward(x, w, residual):
    probe = x[0, 0:1]
    d = where_meta()
    on_meta = {probe: True}.get(probe.to(d), False)
    if x.shape[0] >= 4096 and not on_meta:
        if float(x[0, 0]) == 12345.0:  # a value read: refused on meta, never reached there
            return {"out": residual + 1.0}
        return {"out": residual.clone()}
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
