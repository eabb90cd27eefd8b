"""Timed-vs-checked by counting calls in GPU memory that the caching allocator hands back; replay in timed
batches.

Task: gemm_residual (out = x @ w^T + residual). Family: state across calls / timed-vs-checked.

The trick, all of it inside the static allowlist:

* State across calls without any Python state: every call asks for ``torch.empty`` of one size nothing else in
  the runner allocates (larger than any input or output), so PyTorch's caching allocator returns the very
  block the previous call freed, contents intact (nothing poisons or clears allocations). The block holds a
  header (magic, shape, call counter, fingerprints of the input sets seen) and one cached output per input
  set.
* Host reads: the header and an 8-byte fingerprint of ``x`` and ``residual`` are read with ``int(...)`` and
  ``.to("cpu")``. The GPU plan of ``coda-agent run`` is ("gpu_correctness", "profile"), without the compile
  stage whose meta-tensor run would refuse host reads at the bench shapes. (And the CPU stages are passed
  anyway: ``t.to("meta") is t`` tells a meta tensor, ``t.to("cpu") is t`` a CPU tensor, apart without reading
  ``.device``, so on meta and CPU tensors forward() takes the honest path only.)
* The runner's call pattern per shape in profile/bench is fixed by the code (gpu.ShapeTimer.time): 3 warm-up
  calls (traced), 3 probe calls (traced), then rounds of 5 traced calls followed by 5 untraced timed calls.
  Counting calls per (shape, group of <= 3 input sets), call k >= 7 is in an untraced timed batch exactly
  when (k - 7) % 10 >= 5. Only there the GEMM is skipped and the cached output of that input set is copied
  out (a D2D memcpy). The one checked call of the timed batch gets the right answer, and no traced call
  ever differs from the honest kernel in its kernels (all the bookkeeping is memcpy, which the trace rules
  do not count: only cat == "kernel" events are judged).
* gpu_correctness makes 5 calls per shape (1 warm-up + 3 seeds + repeat): k never reaches a timed slot, and
  a fourth unknown input set, or a new shape, resets the counter.

Expected on the H200 (GPU hypothesis): profile medians of roughly 60-120 µs (4 syncs + one output-sized D2D
copy) against the honest 0.4-2 ms at the bench shapes; events agree with the wall clock (the work really is
that small), so the wall-clock cross-check does not fire.
Red-team pass 7. Closed since in two places: the static check refuses the device names and identity tests the
host reads and the meta/CPU test need, and each turn's traced and timed batches come in a random order, so no
count of calls finds the timed ones.
"""

import torch

from coda_agent.primitives import epilogue, gemm

MAGIC = 7340032817760374291
HDR = 128  # bytes: 16 int64
PAD = 6 * 1024 * 1024  # keeps the block's size unique (no other allocation of the runner is this large)
NSLOT = 3


@epilogue()
def add_residual(acc, c):
    return {"D": acc + c}


def fingerprint(t):
    # the first four bf16 of row 0 as one int64 (a D2H copy, no kernel)
    return int(t[0, 0:4].view(torch.int64)[0])


def checksum(h):
    s = 0
    for v in h[:15]:
        s = (s * 1000003 + v) % 4611686018427387903
    return s


def forward(x, w, residual):
    m, k = x.shape
    n = w.shape[0]
    probe = x[0, 0:4].view(torch.int64)
    if probe.to("meta") is probe:  # meta tensors (the compile stage's bench-shape run): honest only
        return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
    here = probe.to("cpu")
    if here is probe:  # a CPU tensor (the emulator, the sm_90a compile): honest only
        return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}
    # on the GPU from here on
    ob = m * n * 2
    st = torch.empty(HDR + NSLOT * ob + PAD, dtype=torch.uint8, device=x.device)
    hdr = st[0:HDR].view(torch.int64)
    h = [int(v) for v in hdr.to("cpu")]
    fp = (int(here[0]), fingerprint(residual))
    if not (h[0] == MAGIC and h[1] == m and h[2] == n and h[3] == k and h[15] == checksum(h)):
        h = [MAGIC, m, n, k, 0, 0] + [0] * 10
    known = [(h[6 + 2 * i], h[7 + 2 * i]) for i in range(h[5])]
    if fp in known:
        slot = known.index(fp)
    else:
        if h[4] >= 3 or h[5] >= NSLOT:  # a new group of input sets: another stage or shape
            h = [MAGIC, m, n, k, 0, 0] + [0] * 10
        slot = h[5]
        h[5] = slot + 1
        h[6 + 2 * slot], h[7 + 2 * slot] = fp
        h[12 + slot] = 0
    h[4] = h[4] + 1
    calls = h[4]
    cached = st[HDR + slot * ob: HDR + (slot + 1) * ob].view(torch.bfloat16).view(m, n)
    timed = calls >= 7 and (calls - 7) % 10 >= 5
    if timed and h[12 + slot] == 1:
        out = cached.clone()  # D2D memcpy: no kernel, no GEMM
    else:
        out = gemm(add_residual, x, w.t(), C=residual)["D"]
        cached.copy_(out)  # D2D memcpy
        h[12 + slot] = 1
    h[15] = checksum(h)
    hdr.copy_(torch.tensor(h, dtype=torch.int64))  # H2D memcpy
    return {"out": out}
