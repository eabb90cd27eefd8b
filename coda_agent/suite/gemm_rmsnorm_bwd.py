"""Reference for gemm_rmsnorm_bwd: a bf16 dgrad GEMM, then the RMSNorm backward in FP32 (closed form)."""


def reference(dz, w, h, gamma, rstd, zdz, dres):
    g = (dz @ w).float()  # dL/d(normed)
    hf = h.float()
    r = rstd[:, None]
    n = h.shape[-1]
    dh = dres.float() + r * (g * gamma.float() - hf * r * (zdz[:, None] / n))
    dgamma = (g * hf * r).sum(0)
    normed = hf * r * gamma.float()
    return {"dh": dh.to(dres.dtype), "dgamma": dgamma, "normed": normed.to(h.dtype)}
