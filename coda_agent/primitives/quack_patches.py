"""Every place the harness reaches into QuACK's or the CuTe DSL's internals, each a context manager that
restores what it changed on the way out.

QuACK 0.6.5 (with nvidia-cutlass-dsl 4.7.1) has no public switch for any of these, so they are kept here,
together, where a version bump is checked in one place (``tests/test_quack_patches.py`` runs each on a CPU):

* :func:`compile_target`: the arch to build for without a GPU (environment variables, plus the DSL's latched
  target and QuACK's cached capability, which would otherwise outlive them);
* :func:`without_driver`: the one driver query planning makes (the SM count), answered for an H200;
* :func:`compile_only`: both, around each compile-only plan;
* :func:`split_k_plans`: a config's split_k carried into the plans built inside (``EpiMod.plan`` builds every
  plan unsplit whatever its config says: its docstring leaves split-K to ``EpiMod.gemm``);
* :func:`one_stage_mainloop_refused`: a build whose stage split leaves QuACK's mainloop one A/B stage is
  refused (:class:`StageSplitError`) instead of built into a kernel that never finishes.

Harness code only: not part of the candidate surface, and the static check refuses candidates that import it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The H200's SM count: what planning a persistent kernel asks the driver for.
H200_SM_COUNT = 132
ARCH_VARIABLES = ("QUACK_ARCH", "CUTE_DSL_ARCH")


def _clear_capability_caches() -> None:
    """QuACK caches the capability it read from QUACK_ARCH (or the GPU) for the life of the process."""
    from quack import cute_dsl_utils

    cute_dsl_utils._get_device_capacity_cached.cache_clear()
    cute_dsl_utils.get_compile_target_capacity.cache_clear()


@contextmanager
def compile_target(quack_arch: str = "90", cute_dsl_arch: str = "sm_90a") -> Iterator[None]:
    """Build for ``quack_arch`` / ``cute_dsl_arch`` (QuACK's dispatch arch, the ptxas target) without a GPU.

    An arch the environment already names is kept (``QUACK_ARCH=100 CUTE_DSL_ARCH=sm_100a`` builds for SM100).
    cutlass-dsl reads CUTE_DSL_ARCH once, when it is imported, so the target is set on the DSL itself too;
    afterwards the environment is as it was, the DSL's target is again whatever that environment says, and
    QuACK reads its capability afresh.
    """
    saved = {name: os.environ.get(name) for name in ARCH_VARIABLES}
    os.environ.setdefault("QUACK_ARCH", quack_arch)
    os.environ.setdefault("CUTE_DSL_ARCH", cute_dsl_arch)
    from cutlass.cutlass_dsl import CuTeDSL

    dsl_env = CuTeDSL._get_dsl().envar
    dsl_env.arch = os.environ["CUTE_DSL_ARCH"]
    _clear_capability_caches()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        del dsl_env.arch  # the DSL's own reset: CUTE_DSL_ARCH as the environment has it now, or detection
        _clear_capability_caches()


@contextmanager
def without_driver(sm_count: int = H200_SM_COUNT) -> Iterator[None]:
    """Planning asks the driver how many clusters fit at once (the SM count); answer it, then restore the
    query."""
    import quack.gemm_runtime.host as host

    original = host.get_max_active_clusters
    host.get_max_active_clusters = lambda cluster_size: sm_count // cluster_size
    try:
        yield
    finally:
        host.get_max_active_clusters = original


@contextmanager
def compile_only() -> Iterator[None]:
    """What building a kernel for sm_90a on a machine with no GPU needs: the target and the driver
    stand-in."""
    with compile_target(), without_driver():
        yield


@contextmanager
def split_k_plans(split_k: int) -> Iterator[None]:
    """Plans built inside split K ``split_k`` ways, in QuACK's serial mode (deterministic: the partial sums
    are added in split order), which its eager ``EpiMod.plan`` never asks ``EpiMod.gemm`` for."""
    from quack.epilogue.frontend import EpiMod
    from quack.gemm_config import SplitKMode

    original = EpiMod.gemm

    def gemm(self: EpiMod, *args: object, **kwargs: object) -> object:
        return original(self, *args, **kwargs, split_k=split_k, split_k_mode=SplitKMode.SERIAL)

    EpiMod.gemm = gemm
    try:
        yield
    finally:
        EpiMod.gemm = original


#: The fewest A/B stages QuACK's SM90 mainloop finishes with. ``GemmSm90.mma`` keeps one k-tile's MMAs in
#: flight and frees that k-tile's stage only once the next k-tile's stage is full, so with one stage the A/B
#: producer and the MMA warps wait on each other for ever. QuACK's split gives the epilogue its stages first,
#: and at 192x128 cooperative gemm_rmsnorm_bwd's epilogue (C, the tile operand h, the output normed) left one:
#: that kernel never finished on an H100 or an H200, and removing any one of the three let it run in 12-14 s
#: (bench/results/h100-2026-12-05-f-hang.log).
MIN_AB_STAGES = 2


class StageSplitError(ValueError):
    """A tile whose epilogue leaves the mainloop fewer than :data:`MIN_AB_STAGES` A/B stages."""

    def __init__(self, tile_mnk: Any, ab_stages: int) -> None:
        m, n, k = (int(x) for x in tile_mnk)
        super().__init__(
            f"tile {m}x{n} (k {k}) leaves the GEMM's mainloop fewer than {ab_stages} A/B stages beside this "
            "epilogue's shared-memory buffers (C, tile operands, outputs): the kernel would never finish. "
            "Use a smaller tile, or an epilogue with fewer tile operands or outputs")


#: How many :func:`one_stage_mainloop_refused` blocks are open, and the classmethod they replaced.
_open_refusals = 0
_quacks_split: Any = None
_refusals_lock = threading.Lock()


def _checked_split(cls: Any, cta_tile_shape_mnk: Any, *args: Any, **kwargs: Any) -> Any:
    """QuACK's split, refused below :data:`MIN_AB_STAGES` for a class that runs it as its own."""
    stages = _quacks_split.__func__(cls, cta_tile_shape_mnk, *args, **kwargs)
    if stages[0] < MIN_AB_STAGES and getattr(cls._compute_stages, "__func__", None) is _checked_split:
        raise StageSplitError(cta_tile_shape_mnk, MIN_AB_STAGES)
    return stages


@contextmanager
def one_stage_mainloop_refused() -> Iterator[None]:
    """Builds inside raise :class:`StageSplitError` where QuACK's own stage split
    (``GemmSm90._compute_stages``, as its kernel classes run it) leaves fewer than :data:`MIN_AB_STAGES` A/B
    stages. A kernel class with a split of its own (the load-ahead kernel's, which keeps the floor itself) is
    left to it. Nests, across threads: QuACK's split is back when the last block closes."""
    from quack.gemm_sm90 import GemmSm90

    global _open_refusals, _quacks_split
    with _refusals_lock:
        if _open_refusals == 0:
            _quacks_split = GemmSm90.__dict__["_compute_stages"]
            GemmSm90._compute_stages = classmethod(_checked_split)
        _open_refusals += 1
    try:
        yield
    finally:
        with _refusals_lock:
            _open_refusals -= 1
            if _open_refusals == 0:
                GemmSm90._compute_stages = _quacks_split
