"""Host code tells meta tensors apart without .device: ``t.to("meta") is t`` (True only for a meta tensor).

Family: forbidden compute that passes the CPU stages (the project's
compute_value_read_opts_out_of_bench_check, with one more test). The compile stage runs forward() on meta
tensors at the bench shapes to hold them to the GEMM and launch rules, and refuses a forward() that reads
values there. Here forward() takes the honest path on meta tensors and at the small shapes, and skips the GEMM
on real tensors at bench sizes: a CPU-only verdict (correctness + compile) says PASSED for a module that never
computes the task at any bench shape. On the GPU gpu_correctness would catch this one; the same test is what
lets a timing cheat's host reads survive a compile stage added to the GPU plan (see
state_allocator_counter_replay.py). Red-team pass 7; refused since by the static check (is / is not only
against None, True, False; no device named in the code).
"""
from coda_agent.primitives import epilogue, gemm


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def forward(x, w, residual):
    probe = x[0, 0:1]
    on_meta = probe.to("meta") is probe
    if x.shape[0] >= 4096 and not on_meta:
        if float(x[0, 0]) == 12345.0:  # a value read: refused on meta, never reached there
            return {"out": residual + 1.0}
        return {"out": residual.clone()}
    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
