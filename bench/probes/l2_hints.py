"""Issue 44's L2 experiment: the load-ahead kernel with L2 eviction priorities on its TMA copies.

ncu at gemm_rmsnorm_bwd's K-3072 dgrad row (M 32768 x N 2048 x K 3072, H100 at its own clocks, 2026-12-06-b) put
the load-ahead kernel 14% above its plain twin in cycles at the same clock, its math warps waiting on A/B's full
barrier in 18% of their samples (the twin: 6%), and its DRAM traffic at about 1.16 GB against the twin's 0.63 GB,
where A, B, C and the two outputs need 0.62 GB once each. The epilogue's streams (C in, dh and normed out, 0.4 GB)
pass through L2 and evict A's row blocks, which 11 column tiles each read again. QuACK's authors measured a net
loss from evict-first D stores and evict-last B loads at their own shapes (a note in ``quack/gemm_base.py``); this
row is the profile their note asks for.

- :class:`EvictFirstEpilogueSm90`: C's loads and D's stores evict-first (the aux output's stores are QuACK's).
- :class:`EvictLastABSm90`: A's and B's loads evict-last.
- :class:`BothHintsSm90`: both.

``schedule_probe.py --ahead --ahead-kernel bench/probes/l2_hints.py:NAME ...`` (``args/l2_hints.txt``).
"""

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync
from quack import copy_utils

from coda_agent.primitives._ahead import LoadAheadSm90

EVICT_FIRST = 0x12F0000000000000
EVICT_LAST = 0x14F0000000000000


class EvictFirstEpilogueSm90(LoadAheadSm90):
    """C's TMA loads and D's TMA stores with the evict-first policy: streamed once, they leave A and B in L2."""

    epilogue_cache_hint: int | None = EVICT_FIRST

    def epilog_gmem_copy_and_partition(self, atom: Any, mD_mn: cute.Tensor, tile_shape_mn: Any, epi_tile: Any,
                                       sD: cute.Tensor, tile_coord_mnkl: Any) -> Any:
        """QuACK's partition of one tile into TMA subtiles, its copy given :attr:`epilogue_cache_hint`."""
        gD = cute.local_tile(mD_mn, tile_shape_mn, tile_coord_mnkl[:2])
        subtiles = cute.zipped_divide(gD, epi_tile)
        to_gmem = isinstance(atom.op, (cpasync.CopyBulkTensorTileS2GOp, cpasync.CopyReduceBulkTensorTileS2GOp))
        src, dst = (sD, subtiles) if to_gmem else (subtiles, sD)
        return copy_utils.tma_get_copy_fn(atom, cta_coord=0, cta_layout=cute.make_layout(1), src_tensor=src,
                                          dst_tensor=dst, cache_policy=cutlass.Int64(self.epilogue_cache_hint))


class EvictLastABSm90(LoadAheadSm90):
    """A's and B's TMA loads with the evict-last policy: the row blocks the next column tiles read stay in L2."""

    ab_cache_hint = EVICT_LAST


class BothHintsSm90(EvictFirstEpilogueSm90):
    """Evict-first C and D, evict-last A and B."""

    ab_cache_hint = EVICT_LAST
