"""Issue 44's subtile experiment: the load-ahead kernel's epilogue in subtiles twice as wide along N.

On an H100 at cff02a6 (``bench/results/h100-2026-12-05-f-floor-probe.log``) gemm_rmsnorm_bwd's dgrad GEMM of the
Llama-3 1B stack ran at 0.93x cuBLAS at K 16384 and at 0.78x at K 3072, on the same tile (128x192 pingpong). The
shorter the mainloop, the larger the loss: at K 3072 a tile's mainloop is about 20 µs, and its epilogue walks 12
subtiles of 64x32 one after another, each a wait on C and h, the fn, a barrier, a fence and the stores, so the
epilogue's latency rather than its bytes may be what the other warp group's mainloop no longer hides.

:class:`WideSubtileSm90` halves the number of subtiles: 64x64 in pingpong (QuACK keeps a pingpong subtile 64 rows
high: its accumulator runs along N first), 128x64 at cooperative 128-row tiles. Each stage is twice the bytes, so
QuACK's split gives fewer of them. ``bench/probes/args/wide_subtile.txt`` times it beside the kernel as written
and cuBLAS; the outputs must equal the kernel as written bit for bit (the fn sees each element once either way).
"""

from typing import Any

from coda_agent.primitives._ahead import LoadAheadSm90


class WideSubtileSm90(LoadAheadSm90):
    """The load-ahead kernel with its epilogue subtiles twice as wide along N, where the tile allows."""

    @staticmethod
    def _compute_tile_shape_or_override(cta_tile_shape_mnk: Any, atom_layout_mnk: Any, element_type: Any = None,
                                        epi_tile_override: Any = None) -> Any:
        tile_m, tile_n = LoadAheadSm90._compute_tile_shape_or_override(cta_tile_shape_mnk, atom_layout_mnk,
                                                                       element_type, epi_tile_override)
        if epi_tile_override is None and cta_tile_shape_mnk[1] % (2 * tile_n) == 0:
            tile_n *= 2
        return tile_m, tile_n
