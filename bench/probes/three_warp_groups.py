"""Issue 44/45's N-major experiment: a cooperative 192x160 or 192x192 tile as three warp groups of 64 rows.

cuBLAS runs gemm_rmsnorm_bwd's dgrad GEMMs (``dz @ w``, w's N-major B) at a 192x192 tile
(``nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN``: 80.4 ms for the 16-layer step's 33 calls where the load-ahead
kernel at 128x192 pingpong takes 84.6 ms, ``bench/results/h200-2026-12-05-a-e2e-16.md``). QuACK's SM90 kernel
cannot build that tile with an N-major B: it lays a cooperative 192-row tile with N over 128 as two warp groups side
by side along N, and the CuTe DSL's compiler aborts there (``std::bad_variant_access``, 4.7.1 and 4.8.1 alike;
``bench/results/h200-2026-12-03-a-notes.md``). QuACK lays the same tile with N up to 128 as three warp groups of 64
rows, one above the other. :class:`ThreeWarpGroupsSm90` does that at N 160 and 192 too, on the load-ahead kernel:
QuACK's own attributes for its three-group 192x128 tile (warps, register budgets, epilogue barrier), then the
tile's real N. On the CPU the sm_90a build of gemm_rmsnorm_bwd then goes through, with no spills (its 128x192
pingpong default spills 282 registers; ``bench/probes/sass_probe.py``).

What the GPU must say: its outputs against the kernel as written (D and normed bit for bit, dgamma to rounding),
and its time against cuBLAS and the kernel as written (``bench/probes/args/three_warp_groups.txt``). Each warp
group's WGMMA reads all 192 columns of B from shared memory (the split reads half): 128 bytes a cycle at full rate,
the SM's limit, so it may lose where the split wins.
"""

from typing import Any

from coda_agent.primitives._ahead import LoadAheadSm90


class ThreeWarpGroupsSm90(LoadAheadSm90):
    """The load-ahead kernel with a cooperative 192 x (128, 192] tile run by three warp groups along M."""

    def __init__(self, acc_dtype: Any, a_dtype: Any, tile_shape_mnk: tuple[int, ...], *args: Any,
                 **kwargs: Any) -> None:
        tile_m, tile_n = tile_shape_mnk[:2]
        three = not kwargs.get("pingpong", False) and tile_m == 192 and 128 < tile_n <= 192
        # QuACK's three-group layout is the one of its 192x128 tile: built for that, then given the real N.
        super().__init__(acc_dtype, a_dtype, (192, 128, *tile_shape_mnk[2:]) if three else tile_shape_mnk,
                         *args, **kwargs)
        if three:
            assert self.atom_layout_mnk == (3, 1, 1) and self.mma_warp_groups == 3
            self.cta_tile_shape_mnk = (tile_m, tile_n, *self.cta_tile_shape_mnk[2:])
