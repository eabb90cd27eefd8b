"""Issue 44's stage-split experiment: the load-ahead kernel with the mainloop's A/B stages reserved before C's.

ncu's PC sampling at gemm_residual llama3-1b-down (H200, 2026-12-04-b, ``bench/probes/ncu_source.sh``) put the
C-reading kernels' loss to their plain twin in the mainloop, not the epilogue: the MMA warps waited on A/B data
(the full-barrier wait) in 26% of the load-ahead kernel's samples and 30% of QuACK's, against 3% in the twin. Their
SASS shows why: C's stages take an A/B stage (3 against the twin's 4 at 128x256; 4 against 5 at
gemm_residual_rmsnorm's 128x208). QuACK reserves ``epi_c_stage_base`` (4) C stages before it counts A/B stages,
because its epilogue loads C late; the load-ahead kernel loads C under the mainloop, so it may need fewer.

:class:`MainloopFirstSm90` reserves 2, QuACK's arithmetic does the rest (C refined from what one more A/B stage
leaves, the load-ahead kernel's deepening from D's spare stages after). ``schedule_probe.py --ahead-kernel
bench/probes/ahead_stages.py:MainloopFirstSm90`` times it beside the load-ahead kernel as it is.
"""

from typing import Any

from quack.gemm_sm90 import GemmSm90

from coda_agent.primitives._ahead import LoadAheadSm90
from coda_agent.primitives.quack_patches import MIN_AB_STAGES  # noqa: F401  (named in a docstring)


class MainloopFirstSm90(LoadAheadSm90):
    """The load-ahead kernel with 2 C stages reserved before A/B's (QuACK's kernel: 4): 4 A/B stages at 128x256."""

    epi_c_stage_base = 2


class DeepMainloopSm90(LoadAheadSm90):
    """The load-ahead kernel kept to 3 A/B stages where the product keeps 2 (:data:`MIN_AB_STAGES`): at 192x128
    cooperative, gemm_rmsnorm_bwd's epilogue (C, h, normed) leaves QuACK's split one A/B stage, and the product's
    floor gives it 2 out of C's stages (2 A/B, 3 D, 2 C); this one takes D down to 2 for a third (3, 2, 2)."""

    min_ab_stages = 3


class DeepCSm90(LoadAheadSm90):
    """The load-ahead kernel with its A/B stages above 3 turned into C stages, up to a whole tile's subtiles.

    At gemm_rmsnorm_bwd's short-K dgrad row (M 32768 x N 2048 x K 3072) the kernel loses 16-19% to its empty twin in
    the epilogue, at every tile tried (bench/notes/2026-12-05-epilogue-probes.md). In pingpong the product's split
    pays for each warp group's own D buffers out of C's stages (128x192: 4 A/B, 2 + 2 D, 3 C, where QuACK's split
    had 5 C), so the epilogue-load warp runs at most 3 subtiles of C and h ahead of the 12 a tile's epilogue walks;
    each further subtile then waits for a round trip to HBM. This split gives it 8 (3 A/B, 2 + 2 D, 8 C at that tile),
    at a cost of one A/B stage, which a 3072-deep mainloop may not miss."""

    def _compute_stages(self, cta_tile_shape_mnk: Any, epi_tile: Any, a_dtype: Any, b_dtype: Any, d_dtype: Any,
                        c_dtype: Any, epilogue_args: Any, smem_capacity: int, occupancy: int,
                        warp_shape_mnk: Any = None, **kwargs: Any) -> tuple[int, int, int]:
        ab, d, c = super()._compute_stages(cta_tile_shape_mnk, epi_tile, a_dtype, b_dtype, d_dtype, c_dtype,
                                           epilogue_args, smem_capacity, occupancy, warp_shape_mnk, **kwargs)
        if c == 0:
            return ab, d, c
        _, c_bytes, _ = self.epi_stage_bytes(cta_tile_shape_mnk, epi_tile, d_dtype, c_dtype, epilogue_args,
                                             warp_shape_mnk)
        ab_bytes = (cta_tile_shape_mnk[0] + cta_tile_shape_mnk[1]) * cta_tile_shape_mnk[2] * a_dtype.width // 8
        subtiles = cta_tile_shape_mnk[0] * cta_tile_shape_mnk[1] // (epi_tile[0] * epi_tile[1])
        while ab > 3 and c < subtiles:
            ab -= 1
            c = min(subtiles, c + ab_bytes // c_bytes)
        return ab, d, c


class OneStageForCSm90(LoadAheadSm90):
    """The load-ahead kernel with one A/B stage, and no more, turned into C stages (up to a whole tile's).

    At gemm_swiglu_bwd's K-2048 rows the product runs QuACK's kernel at 128x128 packed (5 A/B, 2 D, 5 C), since the
    load-ahead kernel's split there (5 A/B, 2 + 2 D, 2 C) lets its epilogue-load warp run only 2 of a tile's 8 C
    subtiles ahead, and it ran 2-3% slower; DeepCSm90's 3 A/B stages (8 C) ran 0.53x cuBLAS
    (bench/results/h100-2026-12-06-c-notes.md). This split is 4 A/B, 2 + 2 D, 6 C at that tile."""

    def _compute_stages(self, cta_tile_shape_mnk: Any, epi_tile: Any, a_dtype: Any, b_dtype: Any, d_dtype: Any,
                        c_dtype: Any, epilogue_args: Any, smem_capacity: int, occupancy: int,
                        warp_shape_mnk: Any = None, **kwargs: Any) -> tuple[int, int, int]:
        ab, d, c = super()._compute_stages(cta_tile_shape_mnk, epi_tile, a_dtype, b_dtype, d_dtype, c_dtype,
                                           epilogue_args, smem_capacity, occupancy, warp_shape_mnk, **kwargs)
        if c == 0 or ab <= 3:
            return ab, d, c
        _, c_bytes, _ = self.epi_stage_bytes(cta_tile_shape_mnk, epi_tile, d_dtype, c_dtype, epilogue_args,
                                             warp_shape_mnk)
        ab_bytes = (cta_tile_shape_mnk[0] + cta_tile_shape_mnk[1]) * cta_tile_shape_mnk[2] * a_dtype.width // 8
        subtiles = cta_tile_shape_mnk[0] * cta_tile_shape_mnk[1] // (epi_tile[0] * epi_tile[1])
        return ab - 1, d, min(subtiles, c + ab_bytes // c_bytes)


class DeepStoresSm90(LoadAheadSm90):
    """The load-ahead kernel with 4 store buffers for each warp group, paid for out of C's stages above 2, then
    A/B's above 2; what is left over goes back to C.

    The load-ahead epilogue keeps ``store_buffers - 2`` TMA stores in flight when it waits for the next subtile's
    buffers. gemm_rmsnorm_bwd's outputs (D and normed) leave each pingpong group 2 buffers at 128x192 (4 A/B, 2 + 2
    D, 3 C), so every subtile waits until the last one's store has read its buffers, and a tile's 12 subtiles
    store one at a time; its empty twin, with D alone, has more. This split keeps two stores in flight (3 A/B,
    4 + 4 D, 4 C at that tile)."""

    buffers_per_group = 4

    def _compute_stages(self, cta_tile_shape_mnk: Any, epi_tile: Any, a_dtype: Any, b_dtype: Any, d_dtype: Any,
                        c_dtype: Any, epilogue_args: Any, smem_capacity: int, occupancy: int,
                        warp_shape_mnk: Any = None, **kwargs: Any) -> tuple[int, int, int]:
        ab, d, c = super()._compute_stages(cta_tile_shape_mnk, epi_tile, a_dtype, b_dtype, d_dtype, c_dtype,
                                           epilogue_args, smem_capacity, occupancy, warp_shape_mnk, **kwargs)
        want = (2 if self.pingpong else 1) * self.buffers_per_group
        if d == 0 or d >= want:
            return ab, d, c
        d_bytes, c_bytes, unstaged = self.epi_stage_bytes(cta_tile_shape_mnk, epi_tile, d_dtype, c_dtype,
                                                          epilogue_args, warp_shape_mnk)
        ab_bytes = (cta_tile_shape_mnk[0] + cta_tile_shape_mnk[1]) * cta_tile_shape_mnk[2] * a_dtype.width // 8
        budget = smem_capacity // occupancy - 1024 - 2048 - unstaged  # as the product's split reserves

        def used(ab: int, c: int) -> int:
            return ab * ab_bytes + want * d_bytes + c * c_bytes

        while used(ab, c) > budget:
            if c > 2:
                c -= 1
            elif ab > 2:
                ab -= 1
            else:
                return super()._compute_stages(cta_tile_shape_mnk, epi_tile, a_dtype, b_dtype, d_dtype, c_dtype,
                                               epilogue_args, smem_capacity, occupancy, warp_shape_mnk, **kwargs)
        subtiles = cta_tile_shape_mnk[0] * cta_tile_shape_mnk[1] // (epi_tile[0] * epi_tile[1])
        while c and c < subtiles and used(ab, c + 1) <= budget:
            c += 1
        return ab, want, c


class QuackRegistersSm90(LoadAheadSm90):
    """The load-ahead kernel with QuACK's own register split (40 per producer thread, 232 per math thread below
    208 accumulator registers a thread), where :class:`LoadAheadSm90` takes 24/240 from 192."""

    wide_registers_from = None


class NarrowSubtilesSm90(LoadAheadSm90):
    """The load-ahead kernel with subtiles half as wide (64x16 where QuACK takes 64x32): half the registers a
    subtile's C, fn and outputs hold at once, at twice the subtiles (and barriers) a tile.

    For gemm_swiglu_bwd at its K-2048 rows: the 128x128 tile it runs there is L2-bound (its plain twin 0.89x
    cuBLAS on an H100), and the wider 128x192 tile lost 25-30% to spills (the packed epilogue's 64x32 subtile beside
    192 accumulator registers a thread). At 64x16 the sm_90a build of that tile has no spills (``sass_probe.py``)."""

    @staticmethod
    def _compute_tile_shape_or_override(cta_tile_shape_mnk: Any, atom_layout_mnk: Any, element_type: Any = None,
                                        epi_tile_override: Any = None) -> tuple[int, int]:
        tile_m, tile_n = GemmSm90._compute_tile_shape_or_override(cta_tile_shape_mnk, atom_layout_mnk,
                                                                   element_type, epi_tile_override)
        return tile_m, min(tile_n, 16)


class LongKSm90(LoadAheadSm90):
    """The load-ahead kernel with the mainloop at 4 A/B stages and the epilogue's buffers at their floor (2 D
    stages a set, C down to 1), wherever the product's split gives the mainloop fewer; what is left goes to C.

    For a GEMM whose K dwarfs its tile: the LM head's dgrad, 32768 x 2048 x 128256, runs a tile's epilogue once
    in 2004 k-blocks. There every cooperative tile of gemm_rmsnorm_bwd ran 0.56-0.71x cuBLAS on an H100, and ncu
    put 78.5% of the 256x128 kernel's warp samples at the mainloop's stage barrier: its epilogue (C, h, D and
    normed) leaves QuACK's split 2 A/B stages, where cuBLAS runs that GEMM as a 128x256 cooperative tile with 4
    (bench/results/h100-2026-12-06-g-notes.md). At QuACK's 128x32 subtile of a cooperative tile that epilogue's
    floor (2 D, 1 C: 48 KiB) does not fit beside 4 stages (192 KiB), so cooperative tiles take 128x16 subtiles
    here (24 KiB), 128x8 at 256 columns. One C stage costs the epilogue a round trip to HBM a subtile, and two
    store buffers a wait for the last store: a long mainloop hides both many times over.

    Measured on an H100 (bench/results/h100-2026-12-06-h-notes.md): at 256x128 it agrees with the kernel as
    written and runs level with it at the 700 W cap; at 128x256 its dh and dgamma are wrong (the 128x8 subtile
    is the suspect). Neither beat cuBLAS, so the product's split stays as it is."""

    mainloop_stages = 4

    @staticmethod
    def _compute_tile_shape_or_override(cta_tile_shape_mnk: Any, atom_layout_mnk: Any, element_type: Any = None,
                                        epi_tile_override: Any = None) -> tuple[int, int]:
        tile_m, tile_n = GemmSm90._compute_tile_shape_or_override(cta_tile_shape_mnk, atom_layout_mnk,
                                                                   element_type, epi_tile_override)
        if atom_layout_mnk[0] == 1 or epi_tile_override is not None:  # pingpong: QuACK's subtile
            return tile_m, tile_n
        # 128x256: the 256 columns' vectors and reduction leave 512 bytes too few for 16
        return tile_m, min(tile_n, 8 if cta_tile_shape_mnk[1] >= 256 else 16)

    def _compute_stages(self, cta_tile_shape_mnk: Any, epi_tile: Any, a_dtype: Any, b_dtype: Any, d_dtype: Any,
                        c_dtype: Any, epilogue_args: Any, smem_capacity: int, occupancy: int,
                        warp_shape_mnk: Any = None, **kwargs: Any) -> tuple[int, int, int]:
        ab, d, c = super()._compute_stages(cta_tile_shape_mnk, epi_tile, a_dtype, b_dtype, d_dtype, c_dtype,
                                           epilogue_args, smem_capacity, occupancy, warp_shape_mnk, **kwargs)
        if ab >= self.mainloop_stages:
            return ab, d, c
        d_bytes, c_bytes, unstaged = self.epi_stage_bytes(cta_tile_shape_mnk, epi_tile, d_dtype, c_dtype,
                                                          epilogue_args, warp_shape_mnk)
        ab_bytes = (cta_tile_shape_mnk[0] + cta_tile_shape_mnk[1]) * cta_tile_shape_mnk[2] * a_dtype.width // 8
        budget = smem_capacity // occupancy - 1024 - 2048 - unstaged  # as the product's split reserves
        d_floor = (4 if self.pingpong else 2) if d else 0  # 2 store buffers, a set per pingpong group
        c_floor = 1 if c else 0

        def used(c: int) -> int:
            return self.mainloop_stages * ab_bytes + d_floor * d_bytes + c * c_bytes

        if used(c_floor) > budget:
            return ab, d, c
        more = c_floor
        while more < c and used(more + 1) <= budget:
            more += 1
        return self.mainloop_stages, d_floor, more

