"""The torch emulator of each primitive against plain torch, and the contract's error messages."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coda_agent import primitives as P
from coda_agent.primitives import backend
from coda_agent.primitives.configs import chosen_config, config_label

M, N, K = 64, 96, 32


@pytest.fixture
def ab():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=g).bfloat16()
    w = (torch.randn(N, K, generator=g) / K**0.5).bfloat16()
    return a, w, a.float() @ w.float().t()


def test_backend_defaults_to_the_emulator():
    assert backend.active().name == "torch"
    with backend.using("quack-compile") as b:
        assert b.name == "quack-compile"
    assert backend.active().name == "torch"
    with pytest.raises(ValueError, match="unknown backend"):
        backend.set_backend("cuda")


def test_plain_gemm_stores_the_accumulator_rounded(ab):
    a, w, ref = ab

    @P.epilogue()
    def ident(acc):
        return {}

    out = P.gemm(ident, a, w.t())
    assert out["D"].dtype == torch.bfloat16
    assert torch.equal(out["D"], ref.bfloat16())
    assert P.gemm(ident, a, w.t(), out_dtype=torch.float32)["D"].dtype == torch.float32


POSITIVE_DOMAIN = (P.log, P.sqrt, P.rsqrt)


@pytest.mark.parametrize(
    ("fn", "ref"),
    [
        (P.exp, torch.exp), (P.log, torch.log), (P.sqrt, torch.sqrt), (P.rsqrt, torch.rsqrt),
        (P.tanh, torch.tanh), (P.sigmoid, torch.sigmoid), (P.silu, F.silu), (P.relu, torch.relu),
        (P.sin, torch.sin), (P.cos, torch.cos), (P.gelu_tanh, lambda x: F.gelu(x, approximate="tanh")),
        (P.erf, torch.erf),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_unary_value_math_matches_torch(ab, fn, ref):
    a, w, acc = ab
    positive = fn in POSITIVE_DOMAIN

    @P.epilogue(outputs=("y",))
    def epi(acc):
        return {"y": fn(acc * acc + 1 if positive else acc)}

    got = P.gemm(epi, a, w.t(), out_dtype=torch.float32)["y"]
    torch.testing.assert_close(got, ref(acc * acc + 1 if positive else acc), rtol=1e-6, atol=1e-6)


def test_the_emulators_outputs_are_dense_as_the_kernels_are(ab):
    """A constant extra output is a full tile, not a stride-0 view: host code cannot tell the emulator by
    layout."""
    a, w, _ = ab

    @P.epilogue(outputs=("probe",))
    def const(acc):
        return {"D": acc, "probe": 0.0}

    out = P.gemm(const, a, w.t(), out_dtype=torch.float32)
    assert out["probe"].is_contiguous() and out["probe"].stride() == (out["probe"].shape[1], 1)


@P.epilogue(reduces={"s": P.ColVecReduce()})
def _exp_sum(acc, v):
    return {"s": P.exp(acc)}


@P.epilogue(reduces={"s": P.ColVecReduce(combine="max_abs")})
def _shifted_max_abs(acc, v):
    return {"s": acc * v + 1.0}


@P.epilogue(reduces={"s": P.ColVecReduce(scaled=True)})
def _scaled_by_a_shift(acc, v):
    return {"s": (acc + v, acc + v)}


@P.epilogue(reduces={"s": P.ColVecReduce()}, mode="acc_pair")
def _one_lane_shifted(acc, v):
    gate, up = P.unpack(acc)
    return {"s": (gate * v, up + 1.0)}


@P.epilogue(reduces={"s": P.RowVecReduce()})
def _column_sum_of_a_row_vector(acc, v):
    return {"s": acc + v}


@pytest.mark.parametrize(("epi", "where"), [
    (_exp_sum, "N"), (_shifted_max_abs, "N"), (_scaled_by_a_shift, "N"), (_one_lane_shifted, "N"),
    (_column_sum_of_a_row_vector, "M"),
], ids=lambda e: getattr(e, "name", e))
def test_a_reduce_that_folds_a_value_at_the_padding_is_refused(ab, epi, where):
    """On the GPU a partial last tile evaluates the fn at its padding (acc, c and tiles 0) and an add or
    max_abs reduce folds that in: the emulator, which has no tiles, refuses such a sink in one line at any
    shape, tile multiple or not."""
    a, w, _ = ab
    v = torch.rand(M if where == "N" else N) + 0.5  # the vector along the kept axis, never 0
    with pytest.raises(P.EpilogueError, match=f"reduce 's' folds .*, not 0,.* do not divide {where}"):
        P.gemm(epi, a, w.t(), v=v)


def test_the_padding_refusal_names_the_largest_value_folded(ab):
    """exp(acc - m) with a per-row m folds exp(-m) at the padding: the refusal gives the largest such value,
    not the first row's (a router's first row folded 2.7e-42, which read as float noise: the manual seat)."""
    a, w, _ = ab

    @P.epilogue(operands={"m": P.ColVecLoad()}, reduces={"s": P.ColVecReduce()})
    def shifted_exp(acc, m):
        return {"s": P.exp(acc - m)}

    m = torch.full((M,), 100.0)
    m[-1] = 1.0
    with pytest.raises(P.EpilogueError, match=r"reduce 's' folds up to 0\.367879, not 0"):
        P.gemm(shifted_exp, a, w.t(), m=m)


def test_a_reduce_that_folds_zero_at_the_padding_runs(ab):
    """0 at the padding: a square, a max (masked on the GPU), a kept vector times acc, an absolute value."""
    a, w, acc = ab
    col = torch.rand(M) + 0.5

    @P.epilogue(reduces={"sq": P.ColVecReduce(scaled=True), "m": P.ColVecReduce(combine="max"),
                         "abs": P.ColVecReduce(combine="max_abs"), "d": P.RowVecReduce()})
    def fine(acc, col):
        return {"sq": (acc, acc * col), "m": P.exp(acc), "abs": acc * col, "d": P.maximum(acc, -acc)}

    out = P.gemm(fine, a, w.t(), col=col)
    torch.testing.assert_close(out["sq"], (acc * acc * col[:, None]).sum(1))
    torch.testing.assert_close(out["m"], acc.exp().amax(1))
    torch.testing.assert_close(out["d"], acc.abs().sum(0))


def test_swiglu_and_dswiglu_match_autograd():
    g = torch.randn(50, dtype=torch.float64, requires_grad=True)
    u = torch.randn(50, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(50, dtype=torch.float64)
    out = F.silu(g) * u
    out.backward(dout)
    torch.testing.assert_close(P.swiglu(g.detach(), u.detach()), out.detach())
    dg, du, fwd = P.dswiglu(g.detach(), u.detach(), dout)
    torch.testing.assert_close(dg, g.grad)
    torch.testing.assert_close(du, u.grad)
    torch.testing.assert_close(fwd, out.detach())
    torch.testing.assert_close(P.maximum(g.detach(), u.detach()), torch.maximum(g, u).detach())
    torch.testing.assert_close(P.minimum(g.detach(), u.detach()), torch.minimum(g, u).detach())


def test_operand_kinds_and_reductions(ab):
    a, w, acc = ab
    c = torch.randn(M, N).bfloat16()
    row = torch.randn(N)
    col = torch.rand(M) + 0.5

    @P.epilogue(
        outputs=("y",),
        reduces={
            "rsum": P.ColVecReduce(), "rsq": P.ColVecReduce(scaled=True),
            "rmax": P.ColVecReduce(combine="max"), "cabs": P.RowVecReduce(combine="max_abs"),
            "csum": P.RowVecReduce(), "lse": P.OnlineLSEReduce(),
        },
    )
    def epi(acc, c, row, col, s):
        y = (acc + c) * row * col * s
        return {"D": y, "y": -y, "rsum": y, "rsq": (y, y), "rmax": y, "cabs": y, "csum": y, "lse": y}

    out = P.gemm(epi, a, w.t(), C=c, row=row, col=col, s=0.25, out_dtype=torch.float32)
    y = (acc + c.float()) * row[None] * col[:, None] * 0.25
    torch.testing.assert_close(out["D"], y)
    torch.testing.assert_close(out["y"], -y)
    torch.testing.assert_close(out["rsum"], y.sum(1))
    torch.testing.assert_close(out["rsq"], (y * y).sum(1))
    torch.testing.assert_close(out["rmax"], y.amax(1))
    torch.testing.assert_close(out["cabs"], y.abs().amax(0))
    torch.testing.assert_close(out["csum"], y.sum(0))
    torch.testing.assert_close(out["lse"], torch.logsumexp(y, 1))
    assert out["rsum"].shape == (M,) and out["csum"].shape == (N,)


def test_a_vector_passed_as_a_column_is_told_to_go_1d(ab):
    """rstd[:, None] (M, 1), the shape broadcasting wants on the host, is no operand shape: the refusal says
    how to pass it (a manual seat's)."""
    a, w, _ = ab

    @P.epilogue()
    def epi(acc, r):
        return {"D": acc * r}

    with pytest.raises(P.EpilogueError, match=r"operand 'r' has shape \(\d+, 1\): expected a scalar, .*; a "
                                               r"vector is passed 1-D \(or as \(1, length\)\), not as a "
                                               r"column: r\.view\(-1\)$"):
        P.gemm(epi, a, w.t(), r=torch.ones(M, 1))
    torch.testing.assert_close(P.gemm(epi, a, w.t(), r=torch.ones(M))["D"], P.gemm(epi, a, w.t(), r=1.0)["D"])


def test_col_vec_select_gathers_and_marks_out_of_range_rows_nan(ab):
    a, w, acc = ab
    target = torch.randint(0, N, (M,))
    target[3] = -100

    @P.epilogue(reduces={"t": P.ColVecSelect(index="target")})
    def epi(acc):
        return {"t": acc * 2}

    got = P.gemm(epi, a, w.t(), target=target)["t"]
    want = (acc * 2).gather(1, target.clamp(min=0)[:, None])[:, 0]
    assert torch.isnan(got[3])
    mask = torch.arange(M) != 3
    torch.testing.assert_close(got[mask], want[mask])


def test_acc_pair_mode_pairs_adjacent_columns(ab):
    a, w, acc = ab
    rstd = torch.rand(M) + 0.5

    @P.epilogue(outputs=("act",), mode="acc_pair", reduces={"s": P.ColVecReduce(), "cols": P.RowVecReduce()})
    def epi(acc, rstd):
        g, u = P.unpack(acc * rstd)
        return {"D": P.pack(g, u), "act": P.swiglu(g, u), "s": (g, u), "cols": (g, u * 2)}

    out = P.gemm(epi, a, w.t(), rstd=rstd, out_dtype=torch.float32)
    z = acc * rstd[:, None]
    torch.testing.assert_close(out["D"], z)
    torch.testing.assert_close(out["act"], F.silu(z[:, 0::2]) * z[:, 1::2])
    torch.testing.assert_close(out["s"], z.sum(1))
    # sinks span both lanes: a column reduce is per full-width column (lane 1 = odd columns)
    torch.testing.assert_close(out["cols"][0::2], z[:, 0::2].sum(0))
    torch.testing.assert_close(out["cols"][1::2], 2 * z[:, 1::2].sum(0))
    assert out["act"].shape == (M, N // 2)


def test_store_d_false_skips_the_main_output(ab):
    a, w, acc = ab

    @P.epilogue(outputs=("act",), mode="acc_pair")
    def epi(acc):
        g, u = P.unpack(acc)
        return {"act": P.swiglu(g, u)}

    out = P.gemm(epi, a, w.t(), store_d=False, out_dtype=torch.float32)
    assert set(out) == {"act"}
    torch.testing.assert_close(out["act"], F.silu(acc[:, 0::2]) * acc[:, 1::2])


def test_packed_mode_reads_interleaved_c_and_writes_double_width(ab):
    a, w, acc = ab
    preact = torch.randn(M, 2 * N).bfloat16()

    @P.epilogue(outputs=("act",), mode="packed")
    def epi(acc, c):
        x, y = P.unpack(c)
        dx, dy, out = P.dswiglu(x, y, acc)
        return {"D": P.pack(dx, dy), "act": out}

    out = P.gemm(epi, a, w.t(), C=preact)
    x, y = preact.float()[:, 0::2], preact.float()[:, 1::2]
    dx, dy, act = P.dswiglu(x, y, acc)
    expected = torch.stack((dx, dy), -1).reshape(M, 2 * N)
    assert out["D"].shape == (M, 2 * N) and out["D"].dtype == torch.bfloat16
    torch.testing.assert_close(out["D"], expected.bfloat16())
    torch.testing.assert_close(out["act"], act.bfloat16())


def test_a_pair_where_one_value_belongs_is_explained_for_its_mode(ab):
    """A model that reduced pack(dgate, dup) in packed mode was told about acc_pair mode (the manual seat)."""
    a, w, _ = ab
    preact = torch.randn(M, 2 * N).bfloat16()

    @P.epilogue(reduces={"dbias": P.RowVecReduce()}, mode="packed")
    def epi(acc, c):
        x, y = P.unpack(c)
        dx, dy, _ = P.dswiglu(x, y, acc)
        return {"D": P.pack(dx, dy), "dbias": P.pack(dx, dy)}

    with pytest.raises(P.EpilogueError, match=r"reduce 'dbias' is a Pair here.*in packed mode only D is "
                                              r"written as pack\(\).*a reduce of its own"):
        P.gemm(epi, a, w.t(), C=preact)


@pytest.mark.parametrize(
    ("declare", "call", "message"),
    [
        (dict(reduces={"s": P.ColVecReduce()}), dict(extra=1.0), "unexpected operands"),
        (dict(outputs=("y",), reduces={"s": P.ColVecReduce()}), dict(), "did not return declared names"),
        (dict(mode="acc_pair", reduces={"s": P.ColVecReduce()}), dict(), "one value per lane"),
        (dict(reduces={"s": P.ColVecReduce(scaled=True)}), dict(), "scaled: return a"),
        (dict(), dict(), "undeclared names"),
    ],
)
def test_contract_violations_have_clear_messages(ab, declare, call, message):
    a, w, _ = ab

    @P.epilogue(**declare)
    def epi(acc):
        return {"D": acc, "s": acc}

    with pytest.raises(P.EpilogueError, match=message):
        P.gemm(epi, a, w.t(), **call)


def test_a_weight_passed_as_stored_is_told_to_pass_its_transposed_view():
    """A model passed nn.Linear's (N, K) weight as B; the error says what to write."""
    x, w = torch.randn(32, 16).bfloat16(), torch.randn(48, 16).bfloat16()

    @P.epilogue()
    def plain(acc):
        return {"D": acc}

    with pytest.raises(P.EpilogueError, match=r"B is \(N, K\) as nn.Linear stores a weight: .* w.t\(\)"):
        P.gemm(plain, x, w)
    with pytest.raises(P.EpilogueError, match=r"with K = A.shape\[1\]$"):
        P.gemm(plain, x, torch.randn(48, 24).bfloat16())
    # a dgrad's (K, N) weight passed as w.t(): told to drop the .t(), not to add one (a manual seat's)
    with pytest.raises(P.EpilogueError, match=r"B is a transposed view .*: pass that tensor as it is stored"):
        P.gemm(plain, x, torch.randn(16, 48).bfloat16().t())


def test_a_missing_index_operand_is_named_with_its_sink():
    """"missing operands target" led a model to add an fn parameter: the index belongs to a ColVecSelect."""
    x, w = torch.randn(32, 16).bfloat16(), torch.randn(48, 16).bfloat16()

    @P.epilogue(reduces={"pos": P.ColVecSelect()})
    def pick(acc):
        return {"pos": acc}

    with pytest.raises(P.EpilogueError,
                       match=r"missing operands target \(the index= of ColVecSelect sink 'pos'\)"):
        P.gemm(pick, x, w.t())


def test_square_problems_need_pinned_vectors():
    a = torch.randn(32, 16).bfloat16()
    b = torch.randn(16, 32).bfloat16()

    @P.epilogue()
    def epi(acc, v):
        return {"D": acc * v}

    with pytest.raises(P.EpilogueError, match="pin it"):
        P.gemm(epi, a, b, v=torch.ones(32))

    @P.epilogue(operands={"v": P.ColVecLoad()})
    def pinned(acc, v):
        return {"D": acc * v}

    v = torch.arange(32.0)
    torch.testing.assert_close(P.gemm(pinned, a, b, v=v, out_dtype=torch.float32)["D"],
                               (a.float() @ b.float()) * v[:, None])


def test_declaration_errors():
    with pytest.raises(P.EpilogueError, match="first parameter must be named 'acc'"):
        P.epilogue()(lambda x: {})
    with pytest.raises(P.EpilogueError, match="packed mode needs a 'c'"):
        P.epilogue(mode="packed")(lambda acc: {})
    with pytest.raises(P.EpilogueError, match="acc_pair mode allows only"):
        P.epilogue(mode="acc_pair", reduces={"s": P.ColVecReduce(scaled=True)})(lambda acc: {})
    with pytest.raises(ValueError, match="scaled=True is only allowed"):
        P.ColVecReduce(combine="max", scaled=True)


def test_config_rules():
    P.Config().check("element", False)
    with pytest.raises(P.EpilogueError, match="pingpong with tile_m=128 needs tile_n <= 208"):
        P.Config(tile_n=256).check("element", False)
    P.Config(tile_m=256, tile_n=256, pingpong=False).check("element", False)
    with pytest.raises(P.EpilogueError, match="tile_n % 32"):
        P.Config(tile_n=208).check("acc_pair", True)
    P.Config(split_k=4).check("packed", False)
    for bad in (0, 17):
        with pytest.raises(P.EpilogueError, match="split_k must be 1 to 16"):
            P.Config(split_k=bad).check("element", False)
    with pytest.raises(P.EpilogueError, match="split_k > 1 needs D stored"):
        P.Config(split_k=2).check("acc_pair", True, store_d=False)
    assert config_label(P.Config(tile_n=128, split_k=2)) == "128x128 pingpong 2x1 split-k 2"
    P.Config(max_swizzle_size=16).check("element", False)
    for bad in (0, 65):
        with pytest.raises(P.EpilogueError, match=r"max_swizzle_size .* must be 1 to 64"):
            P.Config(max_swizzle_size=bad).check("element", False)
    assert config_label(P.Config(max_swizzle_size=16)) == "128x192 pingpong 2x1 swizzle 16"


def test_split_k_changes_the_schedule_not_the_result(ab):
    """The emulator computes what QuACK's serial split-K does (one FP32 sum, the epilogue once); a split
    config that cannot store D is refused where the call is made, with the harness's override too."""
    from coda_agent.primitives.configs import ScheduleOverride

    a, w, _ = ab

    @P.epilogue(outputs=("act",), mode="acc_pair")
    def epi(acc):
        g, u = P.unpack(acc)
        return {"act": P.swiglu(g, u)}

    split = P.gemm(epi, a, w.t(), out_dtype=torch.float32, config=P.Config(split_k=3))
    whole = P.gemm(epi, a, w.t(), out_dtype=torch.float32)
    assert set(split) == set(whole) == {"D", "act"}
    for name in split:
        torch.testing.assert_close(split[name], whole[name], rtol=0, atol=0)
    with pytest.raises(P.EpilogueError, match="needs D stored"):
        P.gemm(epi, a, w.t(), store_d=False, config=P.Config(split_k=2))
    override = ScheduleOverride()
    override.table = {("epi", a.shape[0], w.shape[0], a.shape[1]): P.Config(split_k=2)}
    with pytest.raises(P.EpilogueError, match="needs D stored"):
        _configs_run(lambda: P.gemm(epi, a, w.t(), store_d=False), override=override)


def test_host_helpers():
    ss = torch.tensor([4.0, 16.0])
    torch.testing.assert_close(P.rstd_from_sqsum(ss, 4, 0.0), torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(P.rstd_correction(torch.tensor([2.0]), torch.tensor([0.5]), 4),
                               torch.tensor([-0.0625]))


def test_value_math_rejects_pairs():
    with pytest.raises(TypeError, match="unpack"):
        P.silu(P.pack(torch.ones(2), torch.ones(2)))
    with pytest.raises(TypeError, match="unpaired value"):
        P.unpack(torch.ones(2))


# --- the schedule: which config each gemm call runs with ------------------------------------------------


def _configs_run(fn, *, override=None):
    """The config of every gemm call ``fn()`` makes on the emulator (with the harness's ``override`` on
    top)."""
    seen = []

    def record(run):
        def observed(call):
            seen.append(chosen_config(call))
            return run(call)

        return observed

    def wrap(run):
        return override.wrap(record(run)) if override is not None else record(run)

    from coda_agent.primitives import _emulator

    with backend.using("torch", run=wrap(_emulator.run)):
        fn()
    return seen


def test_a_pinned_schedule_beats_the_calls_config_and_the_harness_override_beats_both(ab):
    from coda_agent.primitives.configs import ScheduleOverride

    a, w, _ = ab
    written, pinned, harness = (P.Config(tile_n=208), P.Config(tile_n=128, cluster_m=1, cluster_n=2),
                                P.Config(tile_m=256, tile_n=160, pingpong=False))

    @P.epilogue()
    def scaled(acc):
        return {"D": acc * 2.0}

    @P.epilogue()
    def other(acc):
        return {}

    @P.schedule({("scaled", M, N, K): pinned})
    def forward(x, wt):
        return [P.gemm(scaled, x, wt, config=written)["D"], P.gemm(other, x, wt, config=written)["D"],
                P.gemm(scaled, x[:32], wt)["D"]]

    def unpinned(x, wt):
        return P.gemm(scaled, x, wt, config=written)["D"]

    # pinned > config=; a call the table does not name (other epilogue, other M) runs as written (its
    # default: no tile column past the narrow N)
    default = P.Config(tile_m=64, tile_n=N, load_ahead=False)
    assert _configs_run(lambda: forward(a, w.t())) == [pinned, written, default]
    override = ScheduleOverride()
    override.table = {("scaled", M, N, K): harness, ("other", M, N, K): harness}
    assert _configs_run(lambda: forward(a, w.t()), override=override) == [harness, harness, default]
    assert _configs_run(lambda: unpinned(a, w.t())) == [written]  # the schedule holds only inside its forward
    assert forward.__name__ == "forward" and torch.equal(forward(a, w.t())[0], unpinned(a, w.t()))


def test_schedule_refuses_a_malformed_table_and_a_config_the_mode_rejects(ab):
    a, w, _ = ab
    with pytest.raises(P.EpilogueError, match="must be \\(epilogue_name, M, N, K\\)"):
        P.schedule({("e", M, N): P.Config()})
    with pytest.raises(P.EpilogueError, match="must map to a Config"):
        P.schedule({("e", M, N, K): {"tile_n": 208}})
    with pytest.raises(P.EpilogueError, match="takes a dict"):
        P.schedule([("e", M, N, K)])

    @P.epilogue(outputs=("h",), mode="acc_pair")
    def pair(acc):
        g, u = P.unpack(acc)
        return {"D": P.pack(g, u), "h": g * u}

    @P.schedule({("pair", M, N, K): P.Config(tile_n=208)})
    def forward(x, wt):
        return P.gemm(pair, x, wt)

    with pytest.raises(P.EpilogueError,
                       match=r"schedule entry \('pair', 64, 96, 32\): invalid Config: acc_pair mode"):
        forward(a, w.t())


def test_the_config_space_is_what_quack_accepts_for_the_mode_default_first():
    from coda_agent.primitives.configs import CLUSTERS, TILES, config_space

    element = config_space("element", False)
    assert element[0] == P.Config() and len(element) == len(TILES) * len(CLUSTERS) == len(set(element))
    gated = config_space("acc_pair", True)
    assert gated and all(c.tile_n % 32 == 0 for c in gated) and len(gated) < len(element)
    for c in element + gated:
        c.check("element", False)
    # QuACK's own rules for cooperative tiles that it splits along N, caught before a compile
    P.Config(tile_m=320, tile_n=160, pingpong=False).check("element", False)
    for tile_m, tile_n, rule in ((320, 192, "tile_m=320 needs tile_n a multiple of 32 and <= 160"),
                                 (192, 208, "tile_m=192 needs tile_n a multiple of 32"),
                                 (256, 272, "tile_n <= 256, or a multiple of 32 up to 512")):
        with pytest.raises(P.EpilogueError, match=rule):
            P.Config(tile_m=tile_m, tile_n=tile_n, pingpong=False).check("element", False)


def test_a_tile_split_along_n_is_refused_with_an_n_major_b_before_anything_is_built():
    """QuACK's SM90 kernel lays a cooperative 320-row tile's (or 192 x >128's) warp groups side by side along
    N; with an N-major B the CuTe DSL compiler aborts the process (std::bad_variant_access, seen on the CPU
    and the H200). gemm(), the harness's schedule and the tune stage's space all refuse it, with the rule, for
    that layout only."""
    from coda_agent.primitives.configs import config_space

    split = [P.Config(tile_m=320, tile_n=128, pingpong=False),
             P.Config(tile_m=192, tile_n=192, pingpong=False)]
    for config in split:
        assert config.splits_n
        config.check("element", True, b_major="k")
        with pytest.raises(P.EpilogueError, match=r"splits the tile along N .* N-major B"):
            config.check("element", True, b_major="n")
    for config in (P.Config(tile_m=192, tile_n=128, pingpong=False),
                   P.Config(tile_m=256, tile_n=192, pingpong=False), P.Config(tile_n=208)):
        assert not config.splits_n
        config.check("element", True, b_major="n")
    k_major = config_space("element", True, (8192, 4096, 28672))
    assert set(k_major) - set(config_space("element", True, (8192, 4096, 28672), b_major="n")) == {
        c for c in k_major if c.splits_n} and len({c for c in k_major if c.splits_n}) == 4

    a, w = torch.zeros(64, 32).bfloat16(), torch.zeros(96, 32).bfloat16()

    @P.epilogue()
    def plain(acc):
        return {}

    assert P.gemm(plain, a, w.t(), config=split[0])["D"].shape == (64, 96)  # w.t(): K-major
    with pytest.raises(P.EpilogueError, match="pass B K-major"):
        P.gemm(plain, a, w.t().contiguous(), config=split[0])


def test_a_tile_split_along_n_is_refused_for_acc_pair_outputs_which_quack_stores_wrongly():
    """On the H200 (tune stage, gemm_rmsnorm_gemm's gate/up at 8000 x 20000 x 4000) 192x192 and 320x128
    cooperative returned a wrong half-width act (max error 15-18) with every cluster. The CPU emulator cannot
    see that, so gemm() and the tune space refuse the tiles there, and only there: no extra output, or element
    mode, keeps them."""
    from coda_agent.primitives.configs import config_space

    for config in (P.Config(tile_m=320, tile_n=128, pingpong=False),
                   P.Config(tile_m=192, tile_n=192, pingpong=False)):
        with pytest.raises(P.EpilogueError, match="acc_pair mode's half-width outputs"):
            config.check("acc_pair", True)
        config.check("acc_pair", False)
        config.check("element", True)
    assert not any(c.splits_n for c in config_space("acc_pair", True, (8000, 20000, 4000)))
    assert any(c.splits_n for c in config_space("acc_pair", False, (8000, 20000, 4000)))

    @P.epilogue(outputs=("act",), mode="acc_pair")
    def gated(acc):
        gate, up = P.unpack(acc)
        return {"D": acc, "act": P.swiglu(gate, up)}

    a, w = torch.zeros(64, 32).bfloat16(), torch.zeros(256, 32).bfloat16()
    with pytest.raises(P.EpilogueError, match="half-width outputs wrongly"):
        P.gemm(gated, a, w.t(), config=P.Config(tile_m=192, tile_n=192, pingpong=False))
    assert P.gemm(gated, a, w.t(), config=P.Config(tile_m=192, tile_n=128))["act"].shape == (64, 128)


def test_a_tile_split_along_n_builds_for_sm90_with_a_k_major_b(tmp_path, monkeypatch):
    """The rule above is no wider than QuACK needs: with a K-major B the same tile builds (a real sm_90a
    compile)."""
    import quack.cache

    monkeypatch.setattr(quack.cache, "CACHE_DIR", str(tmp_path))
    a, w, r = (torch.zeros(256, 64).bfloat16(), torch.zeros(384, 64).bfloat16(),
               torch.zeros(256, 384).bfloat16())

    @P.epilogue()
    def add_c(acc, c):
        return {"D": acc + c}

    with backend.using("quack-compile"):
        out = P.gemm(add_c, a, w.t(), C=r, config=P.Config(tile_m=320, tile_n=128, pingpong=False))
    assert out["D"].shape == (256, 384) and any(tmp_path.rglob("*.o"))


def test_a_starved_grid_adds_split_k_to_the_space_where_each_split_keeps_enough_k():
    """Fewer output tiles than SMs at the default tile: the tune stage may try split-K; a full grid, a call
    that stores no D, or a K too short to split never gets it."""
    from coda_agent.primitives.configs import MIN_SPLIT_DEPTH, STARVED_SPLITS, config_space

    base = set(config_space("element", True))
    starved = config_space("element", True, (1024, 2048, 8192))
    assert set(starved) == base | set(STARVED_SPLITS) and len(starved) == len(base) + len(STARVED_SPLITS)
    assert set(config_space("element", True, (8192, 4096, 14336))) == base  # 704 tiles: five waves and more
    assert set(config_space("element", True, (1024, 2048, 8192), store_d=False)) == base
    short = config_space("element", True, (1024, 2048, 3 * MIN_SPLIT_DEPTH))
    assert {c.split_k for c in short if c.split_k > 1} == {2, 3}
    assert set(config_space("element", True, (1024, 2048, 8192), sms=64)) == base  # 88 tiles fill 64 SMs


def test_a_calls_space_comes_default_first_then_in_the_order_of_the_wave_model():
    """A search its budget cuts short has tried the configs that waste the least of the grid: at the ragged
    8000 x 4000 that is 128x160 (N in 25 whole tiles, 1,575 tiles in 12 waves of 132), then cuBLAS's 192x192
    (882 tiles, 7 waves), which won the tune stage there on the H200 before 128x160 was searched; at a starved
    grid, the 128x128 tile and the splits that fill the SMs before 128x192's split."""
    from coda_agent.primitives.configs import TILES, config_space, wave_cost

    for mnk in ((8000, 4000, 5000), (8192, 4096, 4096), (1024, 2048, 8192)):
        space = config_space("element", False, mnk)
        costs = [wave_cost(mnk[0], mnk[1], c) for c in space[1:]]
        assert space[0] == P.Config() and costs == sorted(costs), mnk
    ragged = config_space("element", False, (8000, 4000, 5000))
    assert ragged[1:4] == [P.Config(tile_n=160), P.Config(tile_n=160, cluster_m=1, cluster_n=2),
                           P.Config(tile_m=192, tile_n=192, pingpong=False)]
    starved = config_space("element", False, (1024, 2048, 8192))
    assert starved.index(P.Config(tile_n=128, split_k=2)) < starved.index(P.Config(tile_n=192, split_k=2))
    # the space without a call is the order of TILES, the default's tile first (ties of the model keep that
    # order)
    tiles = [(c.tile_m, c.tile_n, c.pingpong) for c in config_space("element", False)]
    assert list(dict.fromkeys(tiles)) == [(128, 192, True)] + [t for t in TILES if t != (128, 192, True)]


def test_the_default_config_narrows_the_tile_in_packed_mode_and_where_the_arch_default_wastes_a_wave():
    from coda_agent.primitives._call import GemmCall, Operand
    from coda_agent.primitives.configs import LONG_K_TILE, NARROW_TILE, PACKED_TILE, default_config, wave_cost

    @P.epilogue()
    def plain(acc):
        return {}

    @P.epilogue(mode="acc_pair")
    def pair(acc):
        g, u = P.unpack(acc)
        return {"D": P.pack(g, u)}

    @P.epilogue(outputs=("normed",))
    def heavy(acc, c, h):  # gemm_rmsnorm_bwd's traffic: C and h in, D and normed out
        return {"D": acc + c, "normed": h}

    @P.epilogue(outputs=("act",), mode="packed")
    def dgated(acc, c):
        gate, up = P.unpack(c)
        dgate, dup, act = P.dswiglu(gate, up, acc)
        return {"D": P.pack(dgate, dup), "act": act}

    @P.epilogue(outputs=("h",), reduces={"sqsum": P.ColVecReduce()})
    def residual_rms(acc, c):
        h = acc + c
        return {"D": h, "h": h, "sqsum": h * h}

    @P.epilogue(reduces={"colsum": P.RowVecReduce()})
    def colsum(acc, c):
        return {"D": acc + c, "colsum": acc}

    def call(epi, m, n, k=64):
        a, b = (torch.empty(m, k, device="meta", dtype=torch.bfloat16),
                torch.empty(k, n, device="meta", dtype=torch.bfloat16))
        tile = torch.empty(m, n, device="meta", dtype=torch.bfloat16)
        c, operands = (tile, {"h": Operand("tile", tile)}) if epi is heavy else (None, {})
        if epi in (residual_rms, colsum):
            c = tile
        if epi is dgated:
            c = torch.empty(m, 2 * n, device="meta", dtype=torch.bfloat16)
        return GemmCall(epi, a, b, c, operands, {}, torch.bfloat16, None, True)

    # M 8192 x N 2048 on 132 SMs: 704 tiles of 128x192 (6 waves, the last a third full) against 1024 of
    # 128x128 (8)
    assert (wave_cost(8192, 2048, P.Config()) / wave_cost(8192, 2048, NARROW_TILE)
            == pytest.approx(1.125, abs=1e-3))
    assert default_config(call(plain, 8192, 2048)) == NARROW_TILE
    # 128 columns keep the 64x32 epilogue subtile
    assert default_config(call(heavy, 8192, 2048)) == NARROW_TILE
    assert default_config(call(plain, 8192, 4096)) is None  # 3.1%: below the bar, the arch default stays
    # the ragged shape, where 128x128 measured 14% slower
    assert default_config(call(plain, 8000, 4000)) is None
    assert default_config(call(plain, 4096, 128256)) is None
    # less than a wave: outside what the rule was measured on
    assert default_config(call(plain, 256, 384)) is None
    # an output narrower than the default's tile (a router's 64 or 56 experts): no MMA on columns past N
    narrow = P.Config(tile_m=64, tile_n=64, load_ahead=False)
    assert default_config(call(plain, 16384, 64)) == default_config(call(plain, 200, 56)) == narrow
    assert default_config(call(pair, 8192, 2048)) is None  # not in acc_pair mode
    # 5 waves of 192 against 8 of 128 on 144 SMs
    assert default_config(call(plain, 8192, 2048), sms=144) is None
    for m, n in ((8192, 14336), (16384, 5632), (8000, 10000), (256, 384)):
        assert default_config(call(dgated, m, n)) == PACKED_TILE  # every packed shape
    # a long K with a light epilogue (C in, outputs and row sums out): cooperative 128x256, where the waves
    # allow it
    for m, n, k in ((8192, 2048, 8192), (8192, 4096, 14336), (8000, 4000, 14336), (16384, 4096, 11008)):
        assert (default_config(call(plain, m, n, k)) == default_config(call(residual_rms, m, n, k))
                == LONG_K_TILE)
    # K below the bar (and 128x128 gains 3%)
    assert default_config(call(residual_rms, 16384, 2048, 5632)) is None
    # a tile operand: gemm_rmsnorm_bwd's kind
    assert default_config(call(heavy, 8192, 2048, 16384)) == NARROW_TILE
    assert default_config(call(colsum, 8192, 4096, 28672)) is None  # a reduce down the columns
    assert default_config(call(plain, 1024, 2048, 8192)) is None  # less than a wave (88 tiles of 128x192)
    # 256 wastes more of a wave than 192 does there
    assert default_config(call(plain, 8192, 6272, 8192)) is None


def test_a_schedule_crosses_the_wire_and_bad_entries_do_not():
    from coda_agent.primitives.configs import schedule_from_wire, schedule_to_wire

    table = {("b", 8, 16, 32): P.Config(tile_n=208), ("a", 1, 2, 3): P.Config(pingpong=False, tile_m=256)}
    wire = schedule_to_wire(table)
    assert [e[0] for e in wire] == ["a", "b"] and schedule_from_wire(wire) == table
    for bad in ([["a", 1, 2, 3, {"tile_q": 1}]], [["a", 1, 2, 3, {"tile_n": True}]],
                [["a", 1, 2, {"tile_n": 128}]], [["a", 1, 2, 3, {"pingpong": 1}]], {"a": 1}):
        with pytest.raises(ValueError):
            schedule_from_wire(bad)


def test_the_quack_plan_key_is_the_calls_metadata_not_its_data():
    """QuACK plans are reused per key (``_quack.run``): one per layout, whatever the values."""
    from coda_agent.primitives import _call, _quack

    @P.epilogue()
    def scaled(acc, s):
        return {"D": acc * s}

    def key(a, b, s):
        call = _call.GemmCall(epi=scaled, A=a, B=b, C=None, operands={}, indices={}, out_dtype=a.dtype,
                              config=None)
        return _quack._plan_key(call, _quack._gemm_config(None), {"s": s})

    a, b = torch.randn(64, 32).bfloat16(), torch.randn(32, 48).bfloat16()
    assert key(a, b, 2.0) == key(torch.randn_like(a), torch.randn_like(b), 3.0)
    assert key(a, b, 2.0) != key(a, torch.randn(48, 32).bfloat16().t(), 2.0)  # another layout of B
    assert key(a, b, 2.0) != key(a.half(), b.half(), 2.0)

    calls = []

    def through_gemm(a, b, s):  # a call from gemm() is keyed by the signature its checks ran under
        with backend.using("fake", run=lambda call: calls.append(call) or call.zero_results()[0]):
            P.gemm(scaled, a, b, s=s)
        return _quack._plan_key(calls[-1], _quack._gemm_config(None), {"s": s})

    assert through_gemm(a, b, 2.0) == through_gemm(torch.randn_like(a), torch.randn_like(b), 3.0)
    assert through_gemm(a, b, 2.0) != through_gemm(a, torch.randn(48, 32).bfloat16().t(), 2.0)
    assert through_gemm(a, b, 2.0) != through_gemm(a.half(), b.half(), 2.0)
    assert calls[0].signature is not None


def test_gemm_checks_a_calls_metadata_once_and_any_change_of_it_again(monkeypatch):
    """The checks run once per signature (issue 9's host time per forward()); a call that differs in anything
    they read (a view's offset, a dtype, an operand's kind, the config) is checked again and refused as
    before."""
    from coda_agent.primitives import _epilogue

    checked = []
    check = _epilogue._check
    monkeypatch.setattr(_epilogue, "_check", lambda *a, **k: checked.append(1) or check(*a, **k))

    @P.epilogue()
    def scaled(acc, s, bias):
        return {"D": acc * s + bias}

    a, b, bias = torch.randn(64, 80).bfloat16(), torch.randn(80, 48).bfloat16(), torch.randn(48)
    first = P.gemm(scaled, a, b, s=2.0, bias=bias)["D"]
    # new values, one signature
    again = P.gemm(scaled, torch.randn_like(a), b, s=3.0, bias=torch.randn(48))["D"]
    assert len(checked) == 1 and not torch.equal(first, again)
    assert torch.allclose(P.gemm(scaled, a, b, s=3.0, bias=bias)["D"].float(),
                          (a.float() @ b.float()) * 3 + bias, rtol=0.02, atol=0.3)
    # same shape, a view off the TMA grid
    with pytest.raises(P.EpilogueError, match=r"offset 1.*contiguous copy"):
        P.gemm(scaled, torch.randn(64, 88).bfloat16()[:, 1:81], b, s=2.0, bias=bias)
    with pytest.raises(P.EpilogueError, match="must have the same dtype"):
        P.gemm(scaled, a.half(), b, s=2.0, bias=bias)
    with pytest.raises(P.EpilogueError, match="matching neither"):  # a vector of another length
        P.gemm(scaled, a, b, s=2.0, bias=torch.randn(40))
    with pytest.raises(P.EpilogueError, match="invalid Config"):
        P.gemm(scaled, a, b, s=2.0, bias=bias, config=P.Config(tile_n=100))
    with pytest.raises(P.EpilogueError, match=r"must be a number or a torch\.Tensor"):
        P.gemm(scaled, a, b, s="2", bias=bias)
    assert len(checked) == 6  # each refused call was checked, the one with no signature ("2") too
    # a scalar tensor: another signature, checked once more
    P.gemm(scaled, a, b, s=torch.tensor(2.0), bias=bias)
    assert len(checked) == 7


@pytest.mark.parametrize("b_kn", [True, False])
def test_the_quack_backend_launches_a_plan_as_quacks_own_run_does(monkeypatch, b_kn):
    """``_quack._launch`` stands in for ``EpiPlan.run`` (one path for split and unsplit plans): the same
    launch arguments, caught on the CPU where QuACK hands them to the compiled kernel."""
    from types import SimpleNamespace

    import quack.epilogue.frontend as frontend
    import quack.gemm_runtime.host as host

    from coda_agent.primitives import _call, _quack

    launches = []

    def record(gemm_plan, A, B, D, C, values, **kw):
        launches.append(
            (gemm_plan, A, B, D, C, values, kw.get("tile_count_semaphore"), kw.get("split_k_buffers")))

    monkeypatch.setattr(frontend, "run_gemm_epi_plan", record)
    monkeypatch.setattr(host, "run_gemm_epi_plan", record)

    @P.epilogue(outputs=("extra",))
    def scaled(acc, c, s):
        return {"D": acc * s + c, "extra": acc}

    a, b, c = torch.randn(64, 32).bfloat16(), torch.randn(32, 48).bfloat16(), torch.randn(64, 48).bfloat16()
    call = _call.GemmCall(epi=scaled, A=a, B=b, C=c, operands={}, indices={}, out_dtype=a.dtype, config=None)
    gemm_plan = SimpleNamespace(split_k=1)
    out = {"D": torch.empty(64, 48).bfloat16(), "extra": torch.empty(64, 48).bfloat16()}
    scratch, kw, counter = {"partials": torch.empty(4)}, {"s": 2.0}, torch.zeros(1, dtype=torch.int32)
    plan = frontend.EpiPlan(gemm_plan=gemm_plan, config=None, out_names=("extra",), b_kn=b_kn,
                            scratch=scratch)
    plan.run(a, b, c, out=out, scratch=scratch, tile_count_semaphore=counter, **kw)
    _quack._launch(plan, call, out, scratch, counter, kw)
    theirs, ours = launches
    assert (ours[0] is theirs[0] and ours[1] is a and ours[3] is out["D"] and ours[4] is c
            and ours[6] is counter)
    assert torch.equal(ours[2], theirs[2]) and ours[2].stride() == theirs[2].stride()  # B as QuACK orients it
    assert ours[5] == theirs[5] and ours[5]["extra"] is out["extra"] and ours[7] is None


def test_rows_off_the_16_byte_grid_are_refused_on_the_cpu_as_the_gpu_would():
    """QuACK compiles every tile for 16-byte-aligned rows; the CPU compile cannot see a call that breaks
    that."""

    @P.epilogue(outputs=("act",), mode="acc_pair")
    def gated(acc):
        gate, up = P.unpack(acc)
        return {"act": P.swiglu(gate, up)}

    a, b = torch.randn(100, 64).bfloat16(), torch.randn(64, 784).bfloat16()
    assert P.gemm(gated, a, b)["act"].shape == (100, 392)
    with pytest.raises(P.EpilogueError,
                       match=r"output 'act' is \(100, 388\) bfloat16, 776 bytes a row.*multiple of 8 "
                             r"elements") as err:
        P.gemm(gated, a, torch.randn(64, 776).bfloat16())
    # the task owns N
    assert "the task's shape is misaligned" in str(err.value) and "pad" not in str(err.value)
    with pytest.raises(P.EpilogueError,
                       match=r"A \(100, 66\) bfloat16 has rows of 66 elements"
                             r".*multiple of 8 elements") as err:
        P.gemm(gated, torch.randn(100, 66).bfloat16(), torch.randn(66, 784).bfloat16())
    # the task owns K
    assert "the task's shape is misaligned" in str(err.value) and "pad" not in str(err.value)
    # w.t(): K-major
    with pytest.raises(P.EpilogueError, match=r"B \(66, 784\) bfloat16 has rows of 66 elements"):
        # A M-major, on the grid
        P.gemm(gated, torch.randn(66, 96).bfloat16().t(), torch.randn(784, 66).bfloat16().t())
    with pytest.raises(P.EpilogueError, match=r"offset 1.*contiguous copy"):
        P.gemm(gated, torch.randn(100, 72).bfloat16()[:, 1:65], b)

    @P.epilogue()
    def plus(acc, c):
        return {"D": acc + c}

    @P.epilogue()
    def plain_d(acc):
        return {}

    w = torch.randn(64, 40).bfloat16()  # N = 40: 80-byte rows, on the grid
    assert (P.gemm(plus, a, w, C=torch.randn(100, 40).bfloat16(), out_dtype=torch.float32)["D"].shape
            == (100, 40))
    # an (N, K) weight: B = weight.t() has 128-byte rows, D 72-byte ones
    weight = torch.randn(36, 64).bfloat16()
    with pytest.raises(P.EpilogueError, match="output 'D' is \\(100, 36\\) bfloat16, 72 bytes"):
        P.gemm(plain_d, a, weight.t())


FIRST_CALL = """
import sys, torch
from coda_agent import primitives as P
from coda_agent.primitives import _quack, backend
print(sorted(m for m in _quack.FIRST_CALL_MODULES if m in sys.modules))
if sys.argv[1] == "preload":
    backend.preload("quack-compile")
else:
    @P.epilogue()
    def add_c(acc, c):
        return {"D": acc + c}
    with backend.using("quack-compile"):
        P.gemm(add_c, torch.zeros(256, 64).bfloat16(), torch.zeros(384, 64).bfloat16().t(),
               C=torch.zeros(256, 384).bfloat16())
print(sorted(m for m in _quack.FIRST_CALL_MODULES if m in sys.modules))
"""


@pytest.mark.slow
def test_the_backends_preload_imports_what_its_first_call_would_and_nothing_imports_it_sooner(tmp_path):
    """A runner imports the QuACK backend's first-call modules while the checker sends the inputs
    (``runner/serve.py``): the list must be what a first call (a real sm_90a build) imports, and none of it
    may be imported by the primitives themselves, or the preload would gain nothing."""
    import json
    import os
    import subprocess
    import sys

    from coda_agent.primitives import _quack

    env = {**os.environ, "QUACK_ARCH": "90", "CUTE_DSL_ARCH": "sm_90a", "QUACK_CACHE_DIR": str(tmp_path)}
    for how in ("first call", "preload"):
        out = subprocess.run([sys.executable, "-c", FIRST_CALL, how], capture_output=True, text=True, env=env,
                             timeout=300, check=True).stdout.splitlines()
        before, after = (json.loads(line.replace("'", '"')) for line in out[-2:])
        assert before == [] and after == sorted(_quack.FIRST_CALL_MODULES), how


@pytest.mark.parametrize("make", [lambda: P.ColVecSelect(index=torch.Tensor),
                                  lambda: P.ColVecSelect(index=["t"]), lambda: P.ColVecReduce(scaled=print),
                                  lambda: P.HeadRstd(128, out=[])])
def test_a_declarations_fields_hold_only_their_own_types(make):
    """A red-team pass kept a callable in ColVecSelect(index=...) at module level and called it as
    `box.index(...)`, an allowed method's name, past the static check: the fields refuse it as they are
    made."""
    with pytest.raises(ValueError, match="must"):
        make()


def test_results_come_in_the_declared_order_whatever_the_backend(ab):
    """QuACK's backend returned the selects after the other sinks, the emulator in declaration order, so
    `list(r)` told the GPU apart (a red-team pass): every backend's results pass through one order."""
    from coda_agent.primitives._epilogue import in_declared_order

    @P.epilogue(outputs=("y",), reduces={"t": P.ColVecSelect(index="target"), "s": P.ColVecReduce()})
    def epi(acc):
        return {"D": acc, "y": acc, "t": acc, "s": acc}

    gpu_order = {"D": 0, "y": 1, "s": 2, "t": 3}
    assert list(in_declared_order(epi, gpu_order)) == ["D", "y", "t", "s"]
    a, w, _ = ab
    assert list(P.gemm(epi, a, w.t(), target=torch.zeros(M, dtype=torch.int64))) == ["D", "y", "t", "s"]


@pytest.mark.parametrize("kw", [{"tile_m": [128]}, {"tile_n": 192.0}, {"pingpong": 1}, {"split_k": True}])
def test_a_configs_fields_hold_only_their_own_types(kw):
    """A list kept in a module-level Config would be state its frozen globals do not freeze (a red-team
    pass); a float or a bool for an int is refused as well, as it is made."""
    with pytest.raises(P.EpilogueError, match=f"invalid Config: {next(iter(kw))} must be"):
        P.Config(**kw)


def test_the_emulator_flushes_subnormals_where_the_gpus_ftz_instructions_do():
    """exp(-88) is subnormal: torch keeps it, ex2.approx.ftz gives 0, and a candidate scaled the difference up
    to a whole unit of its output (a red-team pass); log reads a subnormal as 0, sigmoid's rcp.approx.ftz
    flushes its result, and silu and the SwiGLUs go through it."""
    from coda_agent.primitives import dswiglu, exp, log, sigmoid, silu, swiglu

    x = torch.tensor([-88.0, -80.0, 0.0, -103.0])
    assert exp(x)[0] == 0 and exp(x)[1] > 0 and exp(x)[2] == 1
    assert log(torch.tensor([1e-39, 1e-30]))[0] == float("-inf") and log(torch.tensor([1e-30]))[0] > -70
    g = torch.tensor([-88.0, -5.0])
    assert sigmoid(g)[0] == 0 and sigmoid(g)[1] > 0
    assert silu(g)[0] == 0 and swiglu(g, torch.ones(2))[0] == 0
    dgate, dup, out = dswiglu(g, torch.ones(2), torch.ones(2))
    assert dgate[0] == 0 and dup[0] == 0 and out[0] == 0 and dgate[1] != 0


def test_the_emulator_computes_value_functions_as_the_gpu_does_at_their_edges():
    """Four ways an epilogue told the backends apart with allowed functions alone (a red-team pass): relu of
    -0.0 and of NaN, max with a NaN, silu(-inf), dswiglu's cancellation at a huge gate, sin of a huge angle.
    The emulator now gives the GPU's values."""
    from coda_agent.primitives import dswiglu, maximum, minimum, relu, silu, sin

    zero = relu(torch.tensor([-0.0, float("nan"), -1.0, 2.0]))
    assert zero.tolist() == [0.0, 0.0, 0.0, 2.0] and not torch.signbit(zero[0])
    assert maximum(torch.tensor([float("nan")]), -1.0).item() == -1.0
    assert minimum(torch.tensor([float("nan")]), 2.0).item() == 2.0
    assert torch.isnan(silu(torch.tensor([float("-inf")]))).all()
    assert dswiglu(torch.tensor([1e30]), 1.0, 1.0)[0].item() == 0.0
    assert sin(torch.tensor([2.0**100])).item() == 0.0
    x = torch.linspace(-40, 40, 101)
    assert torch.allclose(sin(x), torch.sin(x), atol=1e-5)
    assert torch.allclose(silu(x), torch.nn.functional.silu(x), rtol=1e-6, atol=1e-6)
    dgate, _, _ = dswiglu(x, torch.ones(101), torch.ones(101))
    s = torch.sigmoid(x)
    assert torch.allclose(dgate, s * (1 + x * (1 - s)), rtol=1e-5, atol=1e-6)
