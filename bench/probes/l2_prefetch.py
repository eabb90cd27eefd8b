"""Issue 44's L2-prefetch experiment: the A/B warp also asks L2 for A/B k-blocks a few blocks beyond the ones it
loads into shared memory.

ncu's PC sampling at gemm_swiglu_bwd llama3-1b (H100, bench/results/h100-2026-12-06-d-notes.md) puts the epilogue
kernels' loss in the mainloop: the MMA warps wait on the next A/B k-block in 20-22% of their samples, where the
plain twin at a 2x2 cluster waits in 4.5%, while the epilogue's own traffic keeps HBM 56-60% busy. A k-block's
TMA load is issued only when a shared-memory stage frees, so its latency is hidden by at most the stages' worth of
MMA (5 stages of 128x128x64: about 1.5 µs); under the epilogue's traffic a miss to HBM takes longer. A prefetch
to L2 (``cp.async.bulk.prefetch.tensor``) takes no shared memory and no barrier: issued ``l2_ahead`` k-blocks
ahead of the stage loads, the load itself should then hit L2. Refuted: 0-34% slower at six rows (the notes;
the version timed, ce12493, branched where this one clamps, and issued the prefetch after the stage's commit).

``schedule_probe.py --ahead-kernel bench/probes/l2_prefetch.py:L2Ahead4Sm90`` times it beside the load-ahead kernel
as it is (same stage split, same epilogue; outputs checked bit for bit).
"""

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from coda_agent.primitives._ahead import LoadAheadSm90


def _prefetch_fn(atom: Any, g_tiles: cute.Tensor, s_tiles: cute.Tensor) -> Any:
    """A function of k that asks L2 for k-block k of ``g_tiles`` ((bM|bN, bK, RestK)), partitioned as the stage
    loads into ``s_tiles`` ((bM|bN, bK, stages)) partition it."""
    g = cute.group_modes(g_tiles, 0, cute.rank(g_tiles) - 1)
    s = cute.group_modes(s_tiles, 0, cute.rank(s_tiles) - 1)

    def prefetch(k: Any) -> None:
        _, g_part = cpasync.tma_partition(atom, 0, cute.make_layout(1), s[None, 0], g[None, k])
        cute.prefetch(atom, cute.filter_zeros(g_part))

    return prefetch


class L2AheadSm90(LoadAheadSm90):
    """The load-ahead kernel whose A/B warp prefetches A and B ``l2_ahead`` k-blocks beyond each stage load."""

    l2_ahead = 4

    def _ab_loads(self, tma_atom_a: Any, gA: cute.Tensor, sA: cute.Tensor, tma_atom_b: Any, gB: cute.Tensor,
                  sB: cute.Tensor, k_tile_cnt: Any) -> list[Any]:
        prefetch_a, prefetch_b = _prefetch_fn(tma_atom_a, gA, sA), _prefetch_fn(tma_atom_b, gB, sB)

        def ahead(k_block: Any, stage: Any, **_: Any) -> None:
            # the tile's last k-block again near its end (a prefetch of a line L2 holds): no branch to stage
            k = cutlass.min(k_block + self.l2_ahead, k_tile_cnt - 1)
            prefetch_a(k)
            prefetch_b(k)

        return [*super()._ab_loads(tma_atom_a, gA, sA, tma_atom_b, gB, sB, k_tile_cnt), ahead]


class L2Ahead2Sm90(L2AheadSm90):
    l2_ahead = 2


class L2Ahead4Sm90(L2AheadSm90):
    l2_ahead = 4


class L2Ahead8Sm90(L2AheadSm90):
    l2_ahead = 8
