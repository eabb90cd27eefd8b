"""The QuACK backend on a GPU: the reused tile counter of the dynamic scheduler, the reused split-K buffers,
and no fill kernel per call.

The SM90 dynamic scheduler counts its tile fetches in one int32 that every launch on a stream shares
(``primitives._quack._tile_counter``); these tests read it back after launches at shapes with fewer tiles than
SMs, ragged edges and several waves, in all three modes, with every kind of reduce, both clusters and a
cooperative tile, and check each result against the FP32 emulator.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from coda_agent import primitives as P
from coda_agent.primitives import _quack, backend, configs
from coda_agent.verifier import trace

pytestmark = pytest.mark.gpu


@P.epilogue()
def plain(acc):
    return {}


@P.epilogue(reduces={"ss": P.ColVecReduce(scaled=True)})
def residual_sumsq(acc, c):
    h = acc + c
    return {"D": h, "ss": (h, h)}


@P.epilogue(outputs=("act",), mode="acc_pair")
def gated(acc):
    gate, up = P.unpack(acc)
    return {"act": P.swiglu(gate, up)}


@P.epilogue(reduces={"lse": P.OnlineLSEReduce(), "tgt": P.ColVecSelect(index="targets")})
def lse_target(acc):
    return {"D": acc, "lse": acc, "tgt": acc}


@P.epilogue(outputs=("act",), reduces={"zdz": P.ColVecReduce()}, mode="packed")
def swiglu_bwd(acc, c):
    gate, up = P.unpack(c)
    dgate, dup, act = P.dswiglu(gate, up, acc)
    return {"D": P.pack(dgate, dup), "act": act, "zdz": dgate * gate + dup * up}


# 2 tiles; ragged M and N; 3-4 waves of 132 SMs
SHAPES = [(256, 192, 128), (1000, 784, 320), (4096, 2048, 1024)]
#: Every mode and sink kind at the default config, and the other cluster and a cooperative tile (one compile
#: each); every mode split-K, whose launches after the first reuse the turnstile flags and partials the first
#: left.
CASES = [
    (plain, None), (residual_sumsq, None), (gated, None), (lse_target, None), (swiglu_bwd, None),
    (residual_sumsq, P.Config(cluster_m=1, cluster_n=2)),
    (plain, P.Config(tile_m=256, tile_n=128, pingpong=False)), (residual_sumsq, P.Config(split_k=2)),
    (gated, P.Config(split_k=3)), (lse_target, P.Config(split_k=2)),
    (swiglu_bwd, P.Config(tile_n=128, split_k=2)),
    # The load-ahead kernel: its own scheduler readers (one more warp per CTA), pingpong and cooperative.
    (plain, P.Config(load_ahead=True)), (residual_sumsq, P.Config(load_ahead=True)),
    (gated, P.Config(load_ahead=True)), (lse_target, P.Config(load_ahead=True)),
    (swiglu_bwd, P.Config(tile_n=128, load_ahead=True)),
    (residual_sumsq, P.Config(cluster_m=1, cluster_n=2, load_ahead=True)),
    (residual_sumsq, P.Config(tile_m=256, tile_n=128, pingpong=False, load_ahead=True)),
    # the narrow-N default's 64-row tile (configs.narrow_n_tile), on QuACK's kernel and on the load-ahead one
    (residual_sumsq, P.Config(tile_m=64, tile_n=64, load_ahead=False)),
    (lse_target, P.Config(tile_m=64, tile_n=64)),
    (residual_sumsq, P.Config(tile_m=64, tile_n=64, load_ahead=True)),
]


def _inputs(m, n, k, epi):
    """A, B and the keyword arguments of one gemm call."""
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    b = (torch.randn(k, n, device="cuda", generator=g) / k**0.5).bfloat16()
    kw = {}
    if "c" in epi.params:
        kw["C"] = torch.randn(m, 2 * n if epi.mode == "packed" else n, device="cuda", generator=g).bfloat16()
    if epi is lse_target:
        kw["targets"] = torch.randint(0, n, (m,), device="cuda", generator=g)
    return a, b, kw


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    err = (got.float() - want.float()).abs().max().item()
    assert err <= 0.02 * max(1.0, want.float().abs().max().item()), err


@pytest.mark.parametrize(("epi", "config"), CASES,
                         ids=[f"{e.name}-{configs.config_label(c)}" for e, c in CASES])
def test_the_tile_counter_is_back_at_zero_after_every_launch(epi, config):
    counter = _quack._tile_counter(torch.device("cuda"))
    for m, n, k in SHAPES:
        a, b, kw = _inputs(m, n, k, epi)
        try:
            with backend.using("quack"):
                got = [P.gemm(epi, a, b, config=config, **kw) for _ in range(3)]
        except P.EpilogueError as exc:  # a config this epilogue cannot run (QuACK's own rules), said up front
            pytest.skip(str(exc))
        torch.cuda.synchronize()
        assert counter.item() == 0, f"the tile counter reads {counter.item()} after launches at {m}x{n}x{k}"
        with backend.using("torch"):
            want = P.gemm(epi, a, b, config=config, **kw)
        for out in got:
            assert out.keys() == want.keys()
            for name in want:
                _close(out[name], want[name])


def test_a_warm_call_launches_the_gemm_alone():
    """QuACK's eager call zero-fills a fresh counter before every dynamic launch; the reused counter does
    not."""
    a, b, kw = _inputs(4096, 2048, 1024, residual_sumsq)
    with backend.using("quack"):
        P.gemm(residual_sumsq, a, b, **kw)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            P.gemm(residual_sumsq, a, b, **kw)
            torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not [k for k in kernels if "fill" in k.lower()], kernels
    assert sum(trace.classify_kernel(k) == "quack" for k in kernels) == 1, kernels


def test_a_warm_split_call_launches_the_gemm_alone_and_repeats_its_result_bit_for_bit():
    """The serial split-K buffers are reused (no zero-filled semaphore per call, as QuACK's own launch makes),
    and the partial sums meet in split order: the same result every launch, and every turnstile flag back at
    zero."""
    a, b, kw = _inputs(1000, 784, 4096, residual_sumsq)
    config = P.Config(split_k=4)
    with backend.using("quack"):
        first = P.gemm(residual_sumsq, a, b, config=config, **kw)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            again = [P.gemm(residual_sumsq, a, b, config=config, **kw) for _ in range(3)]
            torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not [k for k in kernels if "fill" in k.lower()], kernels
    assert sum(k.startswith("kernel_cutlass_kernel_quack") for k in kernels) == 3, kernels
    for out in again:
        for name in first:
            assert torch.equal(out[name], first[name]), name
    flags = [sem for sem, _ in _quack._SPLIT_K_BUFFERS.values()]
    assert flags and all(int(sem.abs().sum()) == 0 for sem in flags)
    with backend.using("torch"):
        want = P.gemm(residual_sumsq, a, b, **kw)
    for name in want:
        _close(first[name], want[name])


def test_streams_get_their_own_counter():
    side = torch.cuda.Stream()
    main = _quack._tile_counter(torch.device("cuda"))
    with torch.cuda.stream(side):
        other = _quack._tile_counter(torch.device("cuda"))
    assert other is not main
    assert _quack._tile_counter(torch.device("cuda")) is main


@pytest.mark.parametrize("config", [None, P.Config(split_k=2)], ids=["whole-k", "split-k"])
def test_a_captured_call_replays_right(config):
    """Under CUDA graph capture the counter (and the split-K buffers) are the graph's own, zeroed on every
    replay."""
    a, b, kw = _inputs(4096, 2048, 1024, residual_sumsq)
    with backend.using("quack"):
        eager = P.gemm(residual_sumsq, a, b, config=config, **kw)  # builds the plan outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = P.gemm(residual_sumsq, a, b, config=config, **kw)
        assert captured.keys() == eager.keys()
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            for name in eager:
                _close(captured[name], eager[name])


@P.epilogue(outputs=("y",))
def erf_of_acc(acc):
    return {"y": P.erf(acc)}


def test_erf_on_the_gpu_is_within_bf16s_rounding_by_far():
    """erf's GPU form (cute.math.erf, fastmath: a polynomial with ex2.approx and rcp.approx) against FP64,
    over [-6, 6] and the tails: what the API reference can state of its precision (printed for the record)."""
    x = torch.cat([torch.linspace(-6, 6, 256 * 192 - 4, dtype=torch.float64),
                   torch.tensor([-30.0, -1e-20, 1e-20, 30.0], dtype=torch.float64)]).reshape(256, 192)
    a = torch.eye(256, device="cuda").bfloat16()  # acc = b exactly, in FP32
    b = x.to(device="cuda", dtype=torch.float32)
    with backend.using("quack"):  # the default backend is the emulator, whose erf is torch's
        got = P.gemm(erf_of_acc, a, b.bfloat16(), out_dtype=torch.float32)["y"].double()
    want = torch.erf(b.bfloat16().double())
    err = (got - want).abs().max().item()
    print(f"erf on {torch.cuda.get_device_name()}: max abs error {err:.3g}")
    assert err <= 1e-6, err  # 4.8e-7 on an H100 (bench/results/h100-2026-12-07-d-gpu-tests.log)


@P.epilogue(operands={"weight": P.RowVecLoad()}, stats={"rstd": P.HeadRstd(128, eps=1e-6, out="rstd_heads")})
def qk_norm128(acc, rstd, weight):
    return {"D": acc * rstd * weight}


@pytest.mark.parametrize("epi", [qk_norm128, "qk_norm64"], ids=["head-128", "head-64"])
def test_qk_norm_on_the_gpu_matches_the_emulator(epi):
    """HeadRstd (QuACK's per-head statistic, fed by the accumulator prepass): 128-column heads at the tile the
    default picks for them (128x128), 64-column heads with V unnormalised at the default 128x192; a ragged M,
    several waves, the statistic returned; the tile counter back at zero."""
    from .test_head_rstd import qk_norm

    epi = qk_norm if epi == "qk_norm64" else epi
    g = torch.Generator(device="cuda").manual_seed(0)
    m, n, k = 3000, 1536 if epi is qk_norm128 else 512, 640
    a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    b = (torch.randn(k, n, device="cuda", generator=g) / k**0.5).bfloat16()
    kw = {"weight": torch.rand(n, device="cuda", generator=g) + 0.5}
    if epi is qk_norm:
        kw["normed"] = (torch.arange(n, device="cuda") < 384).float()
    with backend.using("quack"):
        got = P.gemm(epi, a, b, **kw)
    torch.cuda.synchronize()
    assert _quack._tile_counter(torch.device("cuda")).item() == 0
    want = P.gemm(epi, a, b, **kw)  # the emulator
    assert got.keys() == want.keys() == {"D", "rstd_heads"}
    _close(got["D"], want["D"])
    assert torch.allclose(got["rstd_heads"], want["rstd_heads"], rtol=1e-4)


def test_qk_norm_then_rope_on_the_gpu_matches_the_emulator():
    """HeadRstd in acc_pair mode (the statistic paired as acc, then RoPE's rotation of each pair), as QuACK's
    own qk_rope_epi composes it; a ragged M."""
    from .test_head_rstd import qk_norm_rope, rope_case

    x, w, weight, inv_freq, position = (t.cuda() for t in rope_case(m=3000))
    kw = {"weight": weight, "inv_freq": inv_freq, "position": position}
    with backend.using("quack"):
        got = P.gemm(qk_norm_rope, x, w.t(), **kw)
    want = P.gemm(qk_norm_rope, x, w.t(), **kw)  # the emulator
    _close(got["D"], want["D"])
    assert torch.allclose(got["rstd_heads"], want["rstd_heads"], rtol=1e-4)


@P.epilogue(stats={"rstd": P.HeadRstd(out="r")})
def head_norm_per_call(acc, rstd):
    return {"D": acc * rstd}


def test_a_statistic_given_per_call_on_the_gpu_matches_the_emulator():
    """HeadRstd's head width and eps given to gemm(): one kernel per eps (QuACK's constant), each width its
    own plan; both against the emulator."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(1000, 256, device="cuda", generator=g).bfloat16()
    b = (torch.randn(256, 768, device="cuda", generator=g) / 16).bfloat16()
    for width, eps in ((64, 1e-6), (128, 0.5), (128, 1e-6)):
        stat = P.HeadRstd(width, eps=eps)
        with backend.using("quack"):
            got = P.gemm(head_norm_per_call, a, b, rstd=stat, out_dtype=torch.float32)
        want = P.gemm(head_norm_per_call, a, b, rstd=stat, out_dtype=torch.float32)
        _close(got["D"], want["D"])
        assert got["r"].shape == (1000, 768 // width)
        assert torch.allclose(got["r"], want["r"], rtol=1e-4)

