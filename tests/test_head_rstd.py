"""Per-head statistics (``HeadRstd``): QK-norm after a QKV projection in one kernel.

The emulator's values against the math, the declaration's and the call's rules, the tile that keeps every
head whole (default, pins, the tune stage's space), and the sm_90a build on the CPU. The GPU's values are
tests/test_gpu_primitives.py's.
"""

from __future__ import annotations

import pytest
import torch

from coda_agent import primitives as P
from coda_agent.primitives import backend, configs
from coda_agent.verifier.tuning import gemm_sites

HEAD, N_Q, N_KV = 64, 4, 2


def qkv_case(m: int = 200, k: int = 96, seed: int = 0):
    """x, a QKV weight (N, K), the head weight repeated per Q and K head (ones over V) and the mask of the
    columns the norm acts on (Q and K)."""
    g = torch.Generator().manual_seed(seed)
    n = (N_Q + 2 * N_KV) * HEAD
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * k**-0.5).bfloat16()
    gamma = torch.rand(HEAD, generator=g) + 0.5
    normed = torch.cat([torch.ones((N_Q + N_KV) * HEAD), torch.zeros(N_KV * HEAD)])
    weight = torch.cat([gamma.repeat(N_Q + N_KV), torch.ones(N_KV * HEAD)])
    return x, w, weight, normed


@P.epilogue(operands={"weight": P.RowVecLoad(), "normed": P.RowVecLoad()},
            stats={"rstd": P.HeadRstd(HEAD, eps=1e-6, out="rstd_heads")})
def qk_norm(acc, rstd, weight, normed):
    return {"D": acc * (normed * rstd + (1.0 - normed)) * weight}


def qk_norm_by_hand(x, w, weight, normed, eps=1e-6):
    z = x.double() @ w.double().t()
    heads = z.view(z.shape[0], -1, HEAD)
    rstd = torch.rsqrt(heads.square().mean(-1) + eps)
    out = torch.where(normed.bool(), (heads * rstd[..., None]).flatten(1), z) * weight.double()
    return out, rstd


def test_qk_norm_in_one_gemm_matches_the_math():
    """Q and K heads normalised by their own statistic and scaled by the head weight, V as the GEMM made it,
    the statistic returned per (row, head); a ragged M."""
    x, w, weight, normed = qkv_case()
    out = P.gemm(qk_norm, x, w.t(), weight=weight, normed=normed)
    want, rstd = qk_norm_by_hand(x, w, weight, normed)
    assert out["D"].dtype == torch.bfloat16 and out["rstd_heads"].shape == (200, N_Q + 2 * N_KV)
    assert (out["D"].double() - want).abs().max() <= 2**-8 * want.abs().max()  # D's one bf16 rounding
    assert torch.allclose(out["rstd_heads"].double(), rstd, rtol=1e-5)


def test_a_call_gives_its_own_head_width_and_eps():
    """A task's shapes may differ in head_dim (small CPU shapes, a model's at the bench) and its eps is an
    argument (contract rule 4): gemm() takes ``rstd=HeadRstd(head_dim, eps=eps)`` for the declared stat, the
    declaration's out= kept; a declaration without head_dim needs one at every call."""

    @P.epilogue(stats={"rstd": P.HeadRstd(out="r")})
    def per_call(acc, rstd):
        return {"D": acc * rstd}

    x, w, _, _ = qkv_case()
    z = x.double() @ w.double().t()
    for width, eps in ((64, 1e-6), (128, 0.5)):
        given = P.HeadRstd(width, eps=eps, out="ignored")
        out = P.gemm(per_call, x, w.t(), rstd=given, out_dtype=torch.float32)
        heads = z.view(200, -1, width)
        rstd = torch.rsqrt(heads.square().mean(-1) + eps)
        assert set(out) == {"D", "r"} and out["r"].shape == (200, 512 // width)
        assert torch.allclose(out["r"].double(), rstd, rtol=1e-5)
        assert torch.allclose(out["D"].double(), (heads * rstd[..., None]).flatten(1), rtol=1e-5, atol=1e-5)
    with pytest.raises(P.EpilogueError, match=r"declares no head_dim: pass rstd=HeadRstd\(head_dim"):
        P.gemm(per_call, x, w.t())


def test_the_statistic_is_of_the_accumulator_before_the_fn():
    """A fn that scales acc first still gets the statistic of acc as the GEMM made it."""

    @P.epilogue(stats={"r": P.HeadRstd(HEAD)})
    def scaled_first(acc, r):
        return {"D": (acc * 3.0) * r}

    x, w, _, _ = qkv_case()
    out = P.gemm(scaled_first, x, w.t(), out_dtype=torch.float32)["D"]
    z = x.float() @ w.float().t()
    heads = z.view(z.shape[0], -1, HEAD)
    want = (3.0 * heads * torch.rsqrt(heads.square().mean(-1, keepdim=True) + 1e-6)).flatten(1)
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("make", "match"), [
    (lambda: P.HeadRstd(100), "multiple of 16"),
    (lambda: P.HeadRstd(512), "up to 256|from 16 to 256"),
    (lambda: P.HeadRstd(64, eps=-1.0), "eps"),
])
def test_a_head_width_off_the_tile_grid_is_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_the_declarations_rules():
    with pytest.raises(P.EpilogueError, match="not an operand parameter"):
        P.epilogue(stats={"rstd": P.HeadRstd(64)})(lambda acc: {"D": acc})
    with pytest.raises(P.EpilogueError, match="both a stat and a pinned operand"):
        P.epilogue(operands={"r": P.RowVecLoad()}, stats={"r": P.HeadRstd(64)})(lambda acc, r: {"D": acc * r})
    with pytest.raises(P.EpilogueError, match="element and acc_pair modes"):
        P.epilogue(mode="packed", stats={"r": P.HeadRstd(64)})(lambda acc, c, r: {"D": P.pack(acc, acc)})
    with pytest.raises(P.EpilogueError, match="a name of its own"):
        P.epilogue(outputs=("y",), stats={"r": P.HeadRstd(64, out="y")})(lambda acc, r: {"y": acc})
    with pytest.raises(P.EpilogueError, match="must be a HeadRstd"):
        P.epilogue(stats={"r": P.RowVecLoad()})(lambda acc, r: {"D": acc})  # type: ignore[dict-item]


def test_the_calls_rules():
    """N in whole heads; a stat is given to gemm() as a HeadRstd or not at all; a config or a pin whose tile
    splits a head."""
    x, w, weight, normed = qkv_case()
    with pytest.raises(P.EpilogueError, match="not a multiple of HeadRstd's head_dim 64"):
        P.gemm(qk_norm, x, w[:-16].t(), weight=weight[:-16], normed=normed[:-16])
    stat_given_wrong = r"'rstd' is a stat .* rstd=HeadRstd\(head_dim, eps=...\) for this call, not a Tensor"
    with pytest.raises(P.EpilogueError, match=stat_given_wrong):
        P.gemm(qk_norm, x, w.t(), weight=weight, normed=normed, rstd=torch.ones(200))
    with pytest.raises(P.EpilogueError, match="tile_n=208 must be a multiple of 64"):
        P.gemm(qk_norm, x, w.t(), weight=weight, normed=normed, config=P.Config(tile_n=208))

    @P.schedule({("qk_norm", 200, 512, 96): P.Config(tile_n=160)})
    def forward():
        return P.gemm(qk_norm, x, w.t(), weight=weight, normed=normed)

    with pytest.raises(P.EpilogueError, match=r"schedule entry .*tile_n=160 must be a multiple of 64"):
        forward()


@pytest.mark.parametrize(("default", "head", "want"), [
    (None, 64, None),  # 128x192 holds three 64-column heads
    (None, 128, P.Config(tile_n=128)),
    (None, 80, P.Config(tile_n=160)),
    (None, 256, P.Config(tile_n=256, pingpong=False)),
    (configs.LONG_K_TILE, 128, configs.LONG_K_TILE),
    (configs.narrow_n_tile(128), 128, configs.narrow_n_tile(128)),
])
def test_a_call_that_names_no_config_runs_a_tile_of_whole_heads(default, head, want):
    assert configs.whole_heads(default, head) == want
    assert want is None or (want.tile_n % head == 0 and want.check("element", False) is None)


def test_the_default_config_of_a_qk_norm_call_holds_whole_heads():
    x, w, _, _ = qkv_case(m=8192)

    @P.epilogue(stats={"rstd": P.HeadRstd(128)})
    def norm128(acc, rstd):
        return {"D": acc * rstd}

    call_config = {}

    def record(call):
        call_config["config"] = configs.kernel_config(call)
        return call.zero_results()[0]

    with backend.using("record", run=record):
        P.gemm(norm128, x, w.t())
    assert call_config["config"].tile_n % 128 == 0  # 128x192 would split every other head


def test_a_call_with_a_statistic_runs_on_quacks_kernel_even_with_c():
    """The load-ahead kernel's epilogue has no accumulator prepass: a call that reads C and a statistic runs
    on QuACK's kernel."""
    x, w, _, _ = qkv_case()

    @P.epilogue(stats={"rstd": P.HeadRstd(HEAD)})
    def residual_norm(acc, c, rstd):
        return {"D": acc * rstd + c}

    seen = {}

    def record(call):
        seen["ahead"] = configs.kernel_config(call).load_ahead
        seen["reads_tiles"] = call.reads_tiles
        return call.zero_results()[0]

    with backend.using("record", run=record):
        P.gemm(residual_norm, x, w.t(), C=torch.zeros(200, 512).bfloat16())
    assert seen == {"ahead": False, "reads_tiles": True}


def test_the_tune_stage_searches_tiles_of_whole_heads_only():
    op = {"gemm": [8192, 1536, 2048], "epilogue": "qk_norm", "mode": "element", "outputs": 0,
          "tile_n_multiple": 128, "config": None}
    site, = gemm_sites([op])
    space = site.space()
    assert space and all(c.tile_n % 128 == 0 for c in space)
    unconstrained = gemm_sites([{**op, "tile_n_multiple": 1}])[0].space()
    assert {c.tile_n for c in space} < {c.tile_n for c in unconstrained}
    assert gemm_sites([{**op, "tile_n_multiple": "x"}])[0].tile_n_multiple == 1  # the runner's word, checked


@P.epilogue(operands={"weight": P.RowVecLoad(), "inv_freq": P.RowVecLoad(), "position": P.ColVecLoad()},
            mode="acc_pair", stats={"rstd": P.HeadRstd(HEAD, out="rstd_heads")})
def qk_norm_rope(acc, rstd, weight, inv_freq, position):
    x1, x2 = P.unpack(acc * rstd * weight)
    freq, _ = P.unpack(inv_freq)
    c, s = P.cos(position * freq), P.sin(position * freq)
    return {"D": P.pack(x1 * c - x2 * s, x1 * s + x2 * c)}


def rope_case(m: int = 200):
    x, w, weight, _ = qkv_case(m=m)
    g = torch.Generator().manual_seed(1)
    # a pair's lanes share one frequency
    inv_freq = (torch.rand(w.shape[0] // 2, generator=g) * 0.1).repeat_interleave(2)
    return x, w, weight, inv_freq, torch.arange(m).float()


def test_qk_norm_then_rope_in_acc_pair_mode_matches_the_math():
    """The statistic arrives paired, as acc: per-head RMSNorm then the rotation of each (2j, 2j+1) pair, one
    kernel (QuACK's own qk_rope_epi composition)."""
    x, w, weight, inv_freq, position = rope_case()
    out = P.gemm(qk_norm_rope, x, w.t(), weight=weight, inv_freq=inv_freq, position=position)
    z = x.double() @ w.double().t()
    heads = z.view(200, -1, HEAD)
    rstd = torch.rsqrt(heads.square().mean(-1) + 1e-6)
    y = (heads * rstd[..., None]).flatten(1) * weight.double()
    angle = position.double()[:, None] * inv_freq.double()[None, 0::2]
    y1, y2 = y[:, 0::2], y[:, 1::2]
    c, s = angle.cos(), angle.sin()
    want = torch.stack([y1 * c - y2 * s, y1 * s + y2 * c], -1).flatten(1)
    assert (out["D"].double() - want).abs().max() <= 2**-7 * want.abs().max()
    assert torch.allclose(out["rstd_heads"].double(), rstd, rtol=1e-5)


def test_qk_norm_then_rope_builds_for_sm90_on_the_cpu(tmp_path, monkeypatch):
    """acc_pair mode with the statistic: the default's tile holds whole heads there too, and the sm_90a build
    takes the prepass with the paired fn."""
    import quack.cache

    monkeypatch.setattr(quack.cache, "CACHE_DIR", str(tmp_path))  # built here, not found in a cache
    x, w, weight, inv_freq, position = rope_case(m=256)
    seen = {}

    def record(call):
        seen["config"] = configs.kernel_config(call)
        return call.zero_results()[0]

    with backend.using("record", run=record):
        P.gemm(qk_norm_rope, x, w.t(), weight=weight, inv_freq=inv_freq, position=position)
    assert seen["config"].tile_n % HEAD == 0
    with backend.using("quack-compile"):
        out = P.gemm(qk_norm_rope, x, w.t(), weight=weight, inv_freq=inv_freq, position=position)
    assert out["D"].shape == (256, 512) and out["rstd_heads"].shape == (256, 8)


def test_a_reduce_of_the_bare_statistic_is_refused_at_the_padding():
    """Past N the GPU's padding heads are zeros, whose statistic is rsqrt(eps), not 0: a reduce must not fold
    it (the emulator says so at every shape)."""

    @P.epilogue(stats={"r": P.HeadRstd(HEAD)}, reduces={"s": P.ColVecReduce()})
    def bare(acc, r):
        return {"D": acc * r, "s": r}

    x, w, _, _ = qkv_case()
    with pytest.raises(P.EpilogueError, match="reduce 's' folds up to"):
        P.gemm(bare, x, w.t())


def test_qk_norm_builds_for_sm90_on_the_cpu(tmp_path, monkeypatch):
    """What the emulator accepts, the sm_90a build must: QuACK's per-head statistic with its accumulator
    prepass and the statistic's output, at the tile the default picks."""
    import quack.cache

    monkeypatch.setattr(quack.cache, "CACHE_DIR", str(tmp_path))  # built here, not found in a cache
    x, w, weight, normed = qkv_case(m=256, k=128)
    with backend.using("quack-compile"):
        out = P.gemm(qk_norm, x, w.t(), weight=weight, normed=normed)
    assert out["D"].shape == (256, 512) and out["rstd_heads"].shape == (256, 8)


def test_statistics_given_per_call_build_for_sm90_on_the_cpu(tmp_path, monkeypatch):
    """Two head widths and two eps given to gemm() for one declared statistic: one kernel per (width, eps),
    each built for sm_90a."""
    import quack.cache

    monkeypatch.setattr(quack.cache, "CACHE_DIR", str(tmp_path))

    @P.epilogue(stats={"rstd": P.HeadRstd(out="r")})
    def head_norm(acc, rstd):
        return {"D": acc * rstd}

    x, w, _, _ = qkv_case(m=256, k=128)
    with backend.using("quack-compile"):
        for width, eps in ((64, 1e-6), (128, 0.25)):
            out = P.gemm(head_norm, x, w.t(), rstd=P.HeadRstd(width, eps=eps))
            assert out["r"].shape == (256, 512 // width)
    assert len([k for k in head_norm.backend_cache if isinstance(k, tuple)]) == 2  # an EpiMod per eps

