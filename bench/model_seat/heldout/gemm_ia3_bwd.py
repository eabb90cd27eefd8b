"""Reference for gemm_ia3_bwd: eager PyTorch in the dtype of its inputs (the scale's gradient in FP32)."""


def reference(dy, w_down, a, scale):
    g = dy @ w_down
    return {"da": g * scale, "dscale": (g.float() * a.float()).sum(dim=0)}
