"""Issue 44's L2-prefetch experiment: the A/B warp also asks L2 for A/B k-blocks a few blocks beyond the ones it
loads into shared memory.

ncu's PC sampling at gemm_swiglu_bwd llama3-1b (H100, bench/results/h100-2026-12-06-d-notes.md) puts the epilogue
kernels' loss in the mainloop: the MMA warps wait on the next A/B k-block in 20-22% of their samples, where the
plain twin at a 2x2 cluster waits in 4.5%, while the epilogue's own traffic keeps HBM 56-60% busy. A k-block's
TMA load is issued only when a shared-memory stage frees, so its latency is hidden by at most the stages' worth of
MMA (5 stages of 128x128x64: about 1.5 µs); under the epilogue's traffic a miss to HBM takes longer. A prefetch
to L2 (``cp.async.bulk.prefetch.tensor``) takes no shared memory and no barrier: issued ``l2_ahead`` k-blocks
ahead of the stage loads, the load itself should then hit L2.

``schedule_probe.py --ahead-kernel bench/probes/l2_prefetch.py:L2Ahead4Sm90`` times it beside the load-ahead kernel
as it is (same stage split, same epilogue; outputs checked bit for bit).
"""

from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Boolean, const_expr
from cutlass.cute.nvgpu import cpasync
from cutlass.experimental import primitives as prims
from quack import copy_utils
from quack.pipeline import make_pipeline_state

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

    @cute.jit
    def _load_ab(
        self, ab_pipeline: Any, make_scheduler: Any, varlen_manager: Any, tma_atom_a: Any,
        mA_mkl: cute.Tensor, sA: cute.Tensor, tma_atom_b: Any, mB_nkl: cute.Tensor, sB: cute.Tensor,
        cluster_layout_mnk: cute.Layout, first_tile_issued: Any,
    ) -> None:
        """The product's A/B warp (``LoadAheadSm90._load_ab``) with the prefetches added."""
        if const_expr(self.use_pdl):
            prims.griddepcontrol(prims.GridDepAction.WAIT)
        is_scheduler_warp = Boolean(True)
        if const_expr(cute.size(cluster_layout_mnk) > 1):
            is_scheduler_warp = cute.arch.block_idx_in_cluster() == 0
        tile_scheduler = make_scheduler()
        work_tile = tile_scheduler.initial_work_tile_info()
        producer_state = make_pipeline_state(pipeline.PipelineUserType.Producer, self.ab_stage)
        announce = Boolean(True)
        while work_tile.is_valid_tile:
            tile_coord_mnkl = work_tile.tile_idx
            batch_idx = tile_coord_mnkl[3]
            gA = cute.local_tile(
                varlen_manager.offset_batch_A(mA_mkl, batch_idx),
                cute.select(self.cta_tile_shape_mnk, [0, 2]), (tile_coord_mnkl[0], None),
            )
            gB = cute.local_tile(
                varlen_manager.offset_batch_B(mB_nkl, batch_idx),
                cute.select(self.cta_tile_shape_mnk, [1, 2]), (tile_coord_mnkl[1], None),
            )
            cluster_mn = self.cluster_shape_mnk[:2]
            copy_A = copy_utils.tma_get_block_copy_fn(
                tma_atom_a, src_tensor=gA, dst_tensor=sA,
                tma_multicast={"cluster_shape": cluster_mn, "multicast_dim": "M"},
            )
            copy_B = copy_utils.tma_get_block_copy_fn(
                tma_atom_b, src_tensor=gB, dst_tensor=sB,
                tma_multicast={"cluster_shape": cluster_mn, "multicast_dim": "N"},
            )
            prefetch_A = _prefetch_fn(tma_atom_a, gA, sA)
            prefetch_B = _prefetch_fn(tma_atom_b, gB, sB)
            k_tile_cnt = cute.ceil_div(varlen_manager.len_k(batch_idx), self.cta_tile_shape_mnk[2])
            for k_tile in cutlass.range(k_tile_cnt, unroll=1):
                ab_pipeline.producer_acquire(producer_state)
                tma_bar_ptr = ab_pipeline.producer_get_barrier(producer_state)
                copy_A(k_tile, producer_state.index, tma_bar_ptr=tma_bar_ptr)
                copy_B(k_tile, producer_state.index, tma_bar_ptr=tma_bar_ptr)
                ab_pipeline.producer_commit(producer_state)
                producer_state.advance()
                if k_tile + self.l2_ahead < k_tile_cnt:
                    prefetch_A(k_tile + self.l2_ahead)
                    prefetch_B(k_tile + self.l2_ahead)
            if const_expr(first_tile_issued is not None):  # noqa: SIM102  (compile time, then run time)
                if announce:
                    first_tile_issued.arrive()
                    announce = Boolean(False)
            tile_scheduler.advance_to_next_work(is_scheduler_warp=is_scheduler_warp)
            work_tile = tile_scheduler.get_current_work()
        if const_expr(self.pingpong):
            if is_scheduler_warp:
                tile_scheduler.write_work_tile_to_smem(work_tile)
            work_tile = tile_scheduler.get_current_work()
        ab_pipeline.producer_tail(producer_state)
        if is_scheduler_warp:
            tile_scheduler.producer_tail()


class L2Ahead2Sm90(L2AheadSm90):
    l2_ahead = 2


class L2Ahead4Sm90(L2AheadSm90):
    l2_ahead = 4


class L2Ahead8Sm90(L2AheadSm90):
    l2_ahead = 8
