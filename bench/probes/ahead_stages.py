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
