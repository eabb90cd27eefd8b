"""Issue 44's L2 experiment: the load-ahead kernel with C's (and the tile operands') TMA loads marked evict-first.

At gemm_residual llama3-1b-down the C-reading kernels trail their plain twin by 2.5% (350.4 against 341.9 µs, H200,
``bench/results/h200-2026-12-05-a-notes.md``), and ncu's PC sampling found their MMA warps waiting for A and B in
26-30% of samples against the twin's 3% (``h200-2026-12-04-b-notes.md``). Giving the mainloop its fourth A/B stage
back (``ahead_stages.py``) changed nothing, so the wait is not the stage count. What else the twin does not do:
stream C, an M x N tile read exactly once, through L2 with the normal eviction priority, where it can displace the
A and B blocks that neighbouring tiles are about to read again. :class:`EvictFirstCSm90` loads C, and any (M, N)
tile operand of the epilogue (gemm_rmsnorm_bwd's h), with L2's evict-first policy, so they are the first to go.

QuACK measured other hints a net loss (D stores evict-first with B loads evict-last, its ``gemm_base.py`` note); C
loads were not among them. ``schedule_probe.py --ahead-kernel bench/probes/evict_first_c.py:EvictFirstCSm90``
times it beside the load-ahead kernel as it is (``bench/probes/args/evict_first_c.txt``).
"""

from typing import Any

from cutlass import Int64

from coda_agent.primitives._ahead import L2_EVICT_FIRST, LoadAheadSm90


class EvictFirstCSm90(LoadAheadSm90):
    """The load-ahead kernel whose epilogue-load warp reads C and the tile operands through L2 as
    evict-first."""

    def epi_load_hints(self) -> dict[str, Any]:
        return {"cache_policy": Int64(L2_EVICT_FIRST)}
