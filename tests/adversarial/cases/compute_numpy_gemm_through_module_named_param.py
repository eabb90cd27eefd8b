"""Forbidden compute: the GEMM in numpy, reached through a parameter named math that the check took for the
module.

Family: forbidden compute that passes the CPU stages. The GEMM computed in numpy on the host, invisible to the
op log; a decoy primitives.gemm of the full shape.

Mechanism: a parameter named `math` makes `math.<anything>` a "module attribute" to the static check (no
METHODS or DATA_ATTRS check), so helpers reach any public tensor/ndarray attribute: .is_meta, .numpy(),
ndarray.dot.
"""

import torch

from coda_agent.primitives import epilogue, gemm


@epilogue()
def passthrough(acc):
    return {"D": acc}


def is_meta(math):
    return math.is_meta


def to_np(math):
    return math.numpy()


def astype(math, dt):
    return math.astype(dt)


def np_view(math, dt):
    return math.view(dt)


def dot(math, other):
    return math.dot(other)


def transpose(math):
    return math.T


def as_f32(t):
    # bf16 bits -> int16 (a view: no op logged) -> numpy -> float32 bits
    bits = astype(to_np(t.view(torch.int16)), "int64")
    bits = (bits + 65536 * 65536 * (bits < 0)) * 65536   # unsigned 16-bit, shifted up
    return np_view(astype(bits, "uint32"), "float32")


def to_bf16(a):
    bits = astype(np_view(astype(a, "float32"), "uint32"), "int64")
    bits = (bits + 32767 + (bits // 65536) % 2) // 65536   # round to nearest even
    bits = bits - 65536 * (bits >= 32768)
    return torch.tensor(astype(bits, "int16")).view(torch.bfloat16)


def forward(x, w, residual):
    decoy = gemm(passthrough, x, w.t())["D"]  # the full (M, N, K) GEMM, thrown away
    if is_meta(x):
        return {"out": decoy}
    y = dot(as_f32(x), transpose(as_f32(w))) + as_f32(residual)
    return {"out": to_bf16(y)}
