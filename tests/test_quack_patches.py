"""Each patch of QuACK's internals does its job inside its block and leaves everything as it found it (no
GPU).

QuACK is imported inside the tests, not at collection: it reads QUACK_CACHE_DIR once, when imported, and the
session's cache folder is set only once the tests start (conftest).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from coda_agent import primitives as P
from coda_agent.primitives import backend, quack_patches

CPU = torch.device("cpu")


@pytest.fixture
def no_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU box that names no arch (the state compile_target must come back to)."""
    from quack import cute_dsl_utils

    for name in quack_patches.ARCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    cute_dsl_utils._get_device_capacity_cached.cache_clear()


def dsl_env() -> Any:
    from cutlass.cutlass_dsl import CuTeDSL

    return CuTeDSL._get_dsl().envar


def test_compile_target_sets_the_arch_everywhere_quack_reads_it_then_restores(no_arch):
    from quack import cute_dsl_utils

    before = dsl_env().arch
    with quack_patches.compile_target():
        assert (os.environ["QUACK_ARCH"], os.environ["CUTE_DSL_ARCH"]) == ("90", "sm_90a")
        # cutlass-dsl read CUTE_DSL_ARCH when imported: set on the DSL itself
        assert dsl_env().arch == "sm_90a"
        assert cute_dsl_utils.get_device_capacity() == (9, 0)
        assert cute_dsl_utils.get_compile_target_capacity() == (9, 0)
    assert not any(name in os.environ for name in quack_patches.ARCH_VARIABLES)
    assert dsl_env().arch == before
    if not torch.cuda.is_available():  # QuACK does not remember the arch it read inside the block
        with pytest.raises((RuntimeError, AssertionError)):
            cute_dsl_utils.get_device_capacity()


def test_compile_target_keeps_an_arch_the_environment_names(monkeypatch):
    from quack import cute_dsl_utils

    monkeypatch.setenv("QUACK_ARCH", "100")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")
    with quack_patches.compile_target():
        assert cute_dsl_utils.get_device_capacity() == (10, 0) and dsl_env().arch == "sm_100a"
    assert (os.environ["QUACK_ARCH"], os.environ["CUTE_DSL_ARCH"]) == ("100", "sm_100a")
    assert dsl_env().arch == "sm_100a"


def test_without_driver_answers_the_sm_count_then_restores_the_query():
    from quack.gemm_runtime import host

    original = host.get_max_active_clusters
    with quack_patches.without_driver():
        assert host.get_max_active_clusters(2) == 66
    with pytest.raises(RuntimeError), quack_patches.without_driver(sm_count=100):
        assert host.get_max_active_clusters(1) == 100
        raise RuntimeError("a failed plan")
    assert host.get_max_active_clusters is original


def test_the_compile_only_backend_builds_for_sm90_and_leaves_no_arch_behind(no_arch, tmp_path, monkeypatch):
    """A real sm_90a build in this process, though cutlass had latched another arch (its CPU default)."""
    import quack.cache

    monkeypatch.setattr(quack.cache, "CACHE_DIR", str(tmp_path))  # a cold cache: the kernel is built here
    dsl_env().arch = "sm_100a"
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(256, 128, generator=g).bfloat16(), torch.randn(384, 128, generator=g).bfloat16()

    @P.epilogue()
    def plain_gemm(acc):
        return {}

    with backend.using("quack-compile"):
        out = P.gemm(plain_gemm, a, w.t())
    assert out["D"].shape == (256, 384) and out["D"].dtype == torch.bfloat16
    assert any(tmp_path.rglob("*.o"))
    assert not any(name in os.environ for name in quack_patches.ARCH_VARIABLES)


def test_a_narrow_call_without_a_config_builds_the_narrow_default_tile_for_sm90(no_arch, tmp_path,
                                                                                monkeypatch):
    """The CPU compile builds what the H200 runs: at M 8192 x N 2048 the default is 128x128
    (configs.default_config)."""
    import quack.cache

    from coda_agent.primitives import _quack
    from coda_agent.primitives.configs import NARROW_TILE

    monkeypatch.setattr(quack.cache, "CACHE_DIR", str(tmp_path))
    asked = []
    real = _quack._gemm_config
    monkeypatch.setattr(_quack, "_gemm_config", lambda c: asked.append(c) or real(c))
    a, w, r = (torch.zeros(8192, 64).bfloat16(), torch.zeros(2048, 64).bfloat16(),
               torch.zeros(8192, 2048).bfloat16())

    @P.epilogue()
    def add_c(acc, c):
        return {"D": acc + c}

    with backend.using("quack-compile"):
        out = P.gemm(add_c, a, w.t(), C=r)
    assert asked == [NARROW_TILE] and out["D"].shape == (8192, 2048) and any(tmp_path.rglob("*.o"))


def test_split_k_plans_carries_split_k_into_the_plans_built_inside_then_restores(no_arch, tmp_path,
                                                                                 monkeypatch):
    """QuACK's EpiMod.plan builds unsplit whatever its config says; inside the patch the sm_90a plan is serial
    split-K, and afterwards EpiMod.gemm is QuACK's own again."""
    import quack.cache
    from quack.epilogue.frontend import EpiMod
    from quack.gemm_config import SplitKMode

    monkeypatch.setattr(quack.cache, "CACHE_DIR", str(tmp_path))
    original = EpiMod.gemm
    built = []

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        built.append(original(self, *args, **kwargs))
        return built[-1]

    monkeypatch.setattr(EpiMod, "gemm", spy)
    a, w, r = (torch.zeros(512, 4096).bfloat16(), torch.zeros(256, 4096).bfloat16(),
               torch.zeros(512, 256).bfloat16())

    @P.epilogue()
    def add_c(acc, c):
        return {"D": acc + c}

    with backend.using("quack-compile"):
        out = P.gemm(add_c, a, w.t(), C=r, config=P.Config(split_k=4))
        P.gemm(add_c, a, w.t(), C=r)
    assert out["D"].shape == (512, 256) and any(tmp_path.rglob("*.o"))
    assert [(p.split_k, p.split_k_mode) for p in built] == [(4, SplitKMode.SERIAL), (1, SplitKMode.SERIAL)]
    assert EpiMod.gemm is spy
