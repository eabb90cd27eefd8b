"""Issue 44's epilogue experiment: the load-ahead kernel's epilogue with one barrier and one fence per subtile.

QuACK's SM90 epilogue (``GemmBase.epilogue``) synchronizes every subtile twice over all the epilogue's threads:
once after the TMA warp has waited for a free D buffer (``producer_acquire``) and before anyone writes it, and once
after the fence that makes the writes visible to TMA. A subtile that reads C fences a third time, before it hands
C's stage back. Each of these sits on the epilogue's serial path, once per subtile: 8 to 16 times a tile. The
C-reading rows trail their plain twins by 1-4% where neither C's latency nor its stages explain it
(``bench/results/h200-2026-12-05-a-notes.md``), and gemm_swiglu_bwd's epilogue is latency-bound.

:class:`LeanEpilogueSm90` runs the same math through QuACK's own hooks (``epi_begin``, ``epi_visit_subtile``,
``epi_end_loop``, the store ops, ``epi_end``) in this order, per subtile:

1. the accumulator's subtile; C's stage waited for and read, with the tile operands';
2. the fn;
3. the outputs written to this subtile's buffers; one fence; meanwhile the TMA warp waits until the buffers of the
   *next* subtile are free (``cp.async.bulk.wait_group.read`` with one store fewer in flight than QuACK allows);
4. one barrier; C's stage handed back (the fence of step 3 orders C's reads before the producer's next load);
   the TMA warp stores the subtile.

The buffer of a subtile is free before anyone writes it: the TMA warp waited for its last store before the barrier
of the subtile before. A tile's first subtile relies on the previous tile's last wait (or, in pingpong, on the
drain before the other warp group's turn). The epilogue's ops keep their own barriers (``epi_end_loop``'s flush),
so their staging smem is ordered as before. Outputs should equal the load-ahead kernel's bit for bit.

``schedule_probe.py --ahead-kernel bench/probes/lean_epilogue.py:LeanEpilogueSm90`` times it beside the load-ahead
kernel (``bench/probes/args/lean_epilogue.txt``). :class:`LeanEpilogueEvictFirstSm90` adds ``evict_first_c.py``'s L2
hint; :class:`GroupBuffersSm90` gives each pingpong warp group buffers of its own (issue 44, item 2).
"""

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Int64, const_expr
from quack.epilogue.ops import DStore

from coda_agent.primitives._ahead import L2_EVICT_FIRST, LoadAheadSm90


class LeanEpilogueSm90(LoadAheadSm90):
    """The load-ahead kernel with an epilogue of one barrier and one fence per subtile."""

    @property
    def store_buffers(self) -> int:
        """The D (and output-tile) buffers one warp group's stores rotate through."""
        return self.epi_stage

    def first_store_buffer(self) -> Any:
        """Where the calling warp group's buffers start."""
        return 0

    @cute.jit
    def epilogue(
        self, params: Any, epi_smem_tensors: Any, epi_pipeline: Any, epi_store_pipeline: Any,
        epi_read_state: Any, epi_producer_state: Any, epi_tile: Any, load_acc_subtile: Any, tRS_rD: cute.Tensor,
        tRS_rC: Any, tiled_copy_t2r: Any, tiled_copy_r2s: Any, tRS_sD: Any, tiled_copy_s2r: Any, tSR_rC: Any,
        tSR_sC: Any, copy_D: Any, copy_C: Any, tile_coord_mnkl: Any, varlen_manager: Any, epilogue_barrier: Any,
        tile_scheduler: Any, tidx: Any, is_tma_warp: Any,
    ) -> tuple[Any, Any]:
        """``GemmBase.epilogue``'s contract, for what the load-ahead kernel runs: TMA stores, C and the tile
        operands already on their way (``copy_C`` None)."""
        assert copy_C is None and epi_store_pipeline is not None
        has_C = const_expr(tRS_rC is not None)
        has_epi_load = const_expr(self.epi_c_stage > 0)
        stores = self.epi_setup_aux_out(params, epi_smem_tensors, tiled_copy_r2s, tiled_copy_t2r, tile_coord_mnkl,
                                        varlen_manager, tidx)
        if const_expr(copy_D is not None):
            stores = ((DStore(), self._epi_store_quant("D"), tiled_copy_r2s, tRS_sD, copy_D, None), *stores)
        subtiles = cute.zipped_divide(cute.make_layout(self.cta_tile_shape_mnk[:2]), epi_tile).shape[1]
        order = cute.make_ordered_layout(subtiles, order=(0, 1) if const_expr(self.epi_m_major) else (1, 0))
        count = cute.size(subtiles)
        done_before = tile_scheduler.num_tiles_executed * count
        # stores a TMA warp may leave in flight once the next subtile's buffers must be free
        in_flight = max(self.store_buffers - 2, 0)
        first = self.first_store_buffer()
        epi_tensors = self.epi_begin(params, epi_smem_tensors, epi_tile, tiled_copy_t2r, tiled_copy_r2s,
                                     tile_coord_mnkl, varlen_manager, epilogue_barrier, tidx, tRS_rD.layout)
        if const_expr(self.epi_needs_acc_prepass):
            for i in cutlass.range_constexpr(count):
                load_acc_subtile(tRS_rD, order.get_hier_coord(i), no_release=True)
                self.epi_prepass_subtile(params, epi_tensors, tRS_rD, order.get_hier_coord(i), i)
            self.epi_prepass_end(params, epi_tensors)

        for i in cutlass.range_constexpr(count):
            coord = order.get_hier_coord(i)
            load_acc_subtile(tRS_rD, coord)
            if const_expr(has_epi_load):
                epi_pipeline.consumer_wait(epi_read_state)
                if const_expr(has_C):
                    cute.copy(tiled_copy_s2r, tSR_sC[None, None, None, epi_read_state.index], tSR_rC)
                self.epi_tile_load_s2r(params, epi_tensors, epi_read_state.index)
            loop_tensors = self.epi_begin_loop(params, epi_tensors, coord)
            aux_frags = self.epi_visit_subtile(params, loop_tensors, tRS_rD, tRS_rC)
            self.epi_end_loop(params, epi_tensors, coord, tRS_rD, epi_tile, tiled_copy_t2r, tiled_copy_r2s,
                              tile_coord_mnkl, varlen_manager, tidx)
            frags = ((tRS_rD,) if const_expr(copy_D is not None) else ()) + aux_frags
            buffer = first + (done_before + i) % self.store_buffers
            for j in cutlass.range_constexpr(len(stores)):
                op, quant, tiled_copy, smem, _, _ = stores[j]
                if const_expr(quant is not None):
                    quant.quantize(self, loop_tensors[quant.name], frags[j])
                converted = op.store_convert(self, frags[j], loop_tensors.get("sr_seed"), tidx, tile_coord_mnkl,
                                             done_before, i)
                op.store_r2s(self, tiled_copy, converted, smem[None, None, None, buffer], tidx)
            cute.arch.fence_view_async_shared()  # the writes above, and C's reads, before any async-proxy access
            if is_tma_warp:
                cute.arch.cp_async_bulk_wait_group(in_flight, read=True)  # the next subtile's buffers
            epilogue_barrier.arrive_and_wait()
            if const_expr(has_epi_load):
                epi_pipeline.consumer_release(epi_read_state)
                epi_read_state.advance()
            if is_tma_warp:
                for j in cutlass.range_constexpr(len(stores)):
                    _, _, _, _, copy_out, store_pred = stores[j]
                    if const_expr(store_pred is None):
                        copy_out(src_idx=buffer, dst_idx=coord)
                    else:
                        if store_pred:
                            copy_out(src_idx=buffer, dst_idx=coord)
                epi_store_pipeline.producer_commit()

        self.epi_end(params, epi_tensors, epi_tile, tiled_copy_t2r, tiled_copy_r2s, tile_coord_mnkl, varlen_manager,
                     tidx)
        return epi_read_state, epi_producer_state


class LeanEpilogueEvictFirstSm90(LeanEpilogueSm90):
    """Both experiments: the lean epilogue, and C and the tile operands read through L2 as evict-first
    (``evict_first_c.py``)."""

    def epi_load_hints(self) -> dict[str, Any]:
        return {"cache_policy": Int64(L2_EVICT_FIRST)}


class GroupBuffersSm90(LeanEpilogueSm90):
    """The lean epilogue where, in pingpong, each warp group stores through D (and output-tile) buffers of its
    own, so a group hands the epilogue to the other without draining its stores (issue 44, item 2; QuACK's
    groups share one set and drain at every hand-over, ``LoadAheadSm90.group_epilogue_buffers``). The second
    set comes out of C's stages above 2, then out of each set's D stages above 2, then out of A/B's. Cooperative
    tiles run as :class:`LeanEpilogueSm90`."""

    group_epilogue_buffers = True

    def _compute_stages(  # an instance's: the split depends on pingpong
        self, cta_tile_shape_mnk: Any, epi_tile: Any, a_dtype: Any, b_dtype: Any, d_dtype: Any, c_dtype: Any,
        epilogue_args: Any, smem_capacity: int, occupancy: int, warp_shape_mnk: Any = None, **kwargs: Any,
    ) -> tuple[int, int, int]:
        ab, d, c = super()._compute_stages(cta_tile_shape_mnk, epi_tile, a_dtype, b_dtype, d_dtype, c_dtype,
                                           epilogue_args, smem_capacity, occupancy, warp_shape_mnk, **kwargs)
        if not self.pingpong or d == 0:
            return ab, d, c
        subtile = cute.size(cute.shape(epi_tile))
        op_bytes = self.epi_smem_bytes(epilogue_args, cta_tile_shape_mnk, epi_tile, warp_shape_mnk)
        d_bytes = (subtile * d_dtype.width // 8 if d_dtype is not None else 0) + op_bytes.d_stage
        c_bytes = (subtile * c_dtype.width // 8 if c_dtype is not None else 0) + op_bytes.c_stage
        a_bytes = kwargs.get("a_bytes_per_stage_override") or (
            cta_tile_shape_mnk[0] * cta_tile_shape_mnk[2] * a_dtype.width // 8)
        ab_bytes = (a_bytes + cta_tile_shape_mnk[1] * cta_tile_shape_mnk[2] * b_dtype.width // 8
                    + kwargs.get("ab_extra_bytes_per_stage", 0))
        # QuACK's reserve: the barriers, and a 1 KiB alignment pad before and after the op smem
        budget = smem_capacity // occupancy - 1024 - 2048 - op_bytes.unstaged
        per_group = d
        while ab * ab_bytes + 2 * per_group * d_bytes + c * c_bytes > budget:
            if c > 2:
                c -= 1
            elif per_group > 2:
                per_group -= 1
            else:
                ab -= 1
        assert ab >= 2, "no room for two A/B stages beside two sets of epilogue buffers"
        return ab, 2 * per_group, c

    @property
    def store_buffers(self) -> int:
        return self.epi_stage // 2 if self.pingpong else self.epi_stage

    def first_store_buffer(self) -> Any:
        if not self.pingpong:  # both warp groups store each tile's subtiles together
            return 0
        return (cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4) * self.store_buffers
