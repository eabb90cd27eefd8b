"""Forbidden compute: one epilogue checked on the emulator, another one's kernel built, by swapping backend
caches.

Family: forbidden compute that passes the CPU stages. The emulator checks one epilogue, the kernel built (and
run on the GPU) is another: B's backend_cache is filled with A's QuACK EpiMod (reached through a `math`-named
parameter), so gemm(B) compiles/launches A's kernel. B's fn here indexes its tile (acc[0], a whole row on the
emulator), which QuACK could not trace at all.
"""

from coda_agent.primitives import epilogue, gemm


@epilogue()
def gpu_kernel(acc, c):
    return {"D": acc}                       # what the GPU would run: the residual is dropped


@epilogue()
def checked_fn(acc, c):
    return {"D": acc + c + 0.0 * acc[0]}    # what the emulator checks


def box(math):
    return math.backend_cache


def forward(x, w, residual):
    gemm(gpu_kernel, x[:64], w[:64].t(), C=residual[:64, :64])   # builds A's EpiMod on the quack backends
    box(checked_fn).update(box(gpu_kernel))
    return {"out": gemm(checked_fn, x, w.t(), C=residual)["D"]}
