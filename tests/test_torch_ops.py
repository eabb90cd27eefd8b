"""The task kernels as PyTorch ops (``coda_agent.torch``): a Llama-3 layer stack with its LM head, forward and
backward through the custom ops, against a plain PyTorch model with the same weights.

The reference is ``coda_agent.torch.ReferenceLlamaStack``, written from the model's definition rather than the
ops' helpers, so a wrong layout (rotary pairs, gate/up interleave, head split) shows up too. Its FP32 run is
the truth; its bf16 run is the eager baseline of the suite's tolerance rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from coda_agent.primitives import backend
from coda_agent.tasks import find_task
from coda_agent.torch import (
    CHAIN_TASKS,
    CodaLlamaLayer,
    CodaLlamaStack,
    CodaLMHead,
    Kernels,
    ReferenceLlamaStack,
    scaled_exp,
    task_op,
)
from coda_agent.torch.check import check_gradients, gradient_errors, loss_and_gradients
from coda_agent.torch.ops import SCALED_EXP_CHUNK

IGNORE = -100
#: The chain's own LM head (its cross-entropy tasks' kernels), which most tests here judge; the scaled-exp
#: head that ``Kernels()`` runs by default has tests of its own.
OWN_HEAD = None


def make_stack(dim: int, ffn: int, heads: int, kv_heads: int, vocab: int, layers: int, device: str = "cpu",
               kernels: Kernels | None = None, seed: int = 0) -> CodaLlamaStack:
    """A stack with norm weights away from 1 (so a gamma in the wrong place shows)."""
    torch.manual_seed(seed)
    kernels = kernels or Kernels(scaled_exp_chunk=OWN_HEAD)
    stack = CodaLlamaStack([CodaLlamaLayer(dim, ffn, heads, kv_heads, kernels=kernels, device=device)
                            for _ in range(layers)],
                           CodaLMHead(dim, vocab, kernels=kernels, device=device))
    with torch.no_grad():
        for p in stack.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p, dtype=torch.float32) + 0.5)
    return stack


def draw_batch(stack: CodaLlamaStack, batch: int, seq: int,
               seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states of rms ~4 (rstd far from 1) and targets with about 1 in 5 ignored."""
    g = torch.Generator().manual_seed(seed)
    dim, vocab = stack.head.weight.shape[1], stack.head.weight.shape[0]
    device = stack.head.weight.device
    h = (torch.randn(batch, seq, dim, generator=g) * 4).to(torch.bfloat16).to(device)
    targets = torch.randint(0, vocab, (batch, seq), generator=g)
    targets[torch.rand(batch, seq, generator=g) < 0.2] = IGNORE
    return h, targets.to(device)


def reference_loss(stack: CodaLlamaStack, h: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype,
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The same model in plain PyTorch at ``dtype``, and its gradients (those of ``h`` under the name
    ``h``)."""
    return loss_and_gradients(ReferenceLlamaStack.like(stack, dtype), h, targets)


def coda_loss(stack: CodaLlamaStack, h: torch.Tensor, targets: torch.Tensor,
              run=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients through the ops (``run`` wraps the stack, e.g. in torch.compile)."""
    return loss_and_gradients(stack, h, targets, run)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def assert_within_the_tolerance_rule(got: dict[str, torch.Tensor], truth: dict[str, torch.Tensor],
                                     eager: dict[str, torch.Tensor]) -> None:
    """Every gradient passes the suite's rule: max error <= factor * the bf16 eager model's + floor * max(1,
    |truth|), with the factor and floor every chain task uses (``coda_agent.torch.check``)."""
    failed = [f"d{e.name}: max error {e.error:.3g} > allowed {e.allowed:.3g}"
              for e in gradient_errors(got, truth, eager) if not e.passed]
    assert not failed, failed


SMALL = {"dim": 64, "ffn": 96, "heads": 4, "kv_heads": 2, "vocab": 160, "layers": 2}


@pytest.fixture(scope="module")
def small() -> tuple[CodaLlamaStack, torch.Tensor, torch.Tensor]:
    stack = make_stack(**SMALL)
    h, targets = draw_batch(stack, batch=2, seq=24)
    return stack, h, targets


@pytest.fixture(scope="module")
def eager_run(small):
    stack, h, targets = small
    return coda_loss(stack, h, targets)


@pytest.fixture(scope="module")
def truth(small):
    stack, h, targets = small
    return reference_loss(stack, h, targets, torch.float32)


def test_the_batch_has_counted_and_ignored_tokens(small):
    _, _, targets = small
    assert 0 < int((targets == IGNORE).sum()) < targets.numel()


def test_the_loss_matches_autograd(eager_run, truth):
    (loss, _), (want, _) = eager_run, truth
    assert abs(float(loss) - float(want)) <= 1e-2 * abs(float(want))


@pytest.mark.parametrize("name", ["h", *(f"layers.{i}.{p}" for i in range(2) for p in
                                        ("attention_norm", "wqkv", "wo", "ffn_norm", "w_gate_up", "w_down")),
                                  "head.norm", "head.weight"])
def test_every_gradient_matches_fp32_autograd(eager_run, truth, name):
    (_, got), (_, want) = eager_run, truth
    err = relative_error(got[name], want[name])
    assert err < 2e-2, f"d{name}: relative error {err:.3g}"


def test_the_gradients_pass_the_suites_tolerance_rule(small, eager_run, truth):
    stack, h, targets = small
    _, eager = reference_loss(stack, h, targets, torch.bfloat16)
    assert_within_the_tolerance_rule(eager_run[1], truth[1], eager)


@pytest.mark.parametrize("compile_backend", ["eager", "aot_eager"])
def test_torch_compile_around_the_stack_matches_eager(small, eager_run, compile_backend):
    """One graph (``fullgraph=True``) around the custom ops; inductor works too, but takes ~15 s on a CPU."""
    stack, h, targets = small
    torch._dynamo.reset()
    loss, grads = coda_loss(stack, h, targets,
                            run=torch.compile(stack, backend=compile_backend, fullgraph=True))
    want_loss, want = eager_run
    assert torch.equal(loss, want_loss)
    assert all(torch.equal(grads[name], g) for name, g in want.items())


def test_a_new_sequence_length_recompiles_once_with_dynamic_shapes(small):
    """torch.compile's automatic dynamic shapes: the second length compiles a symbolic graph, the third reuses
    it. (``dynamic=True`` from the start fails inside dynamo's autograd.Function tracing, torch 2.13.)"""
    from torch._dynamo.testing import CompileCounterWithBackend

    stack, _, _ = small
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    run = torch.compile(stack, backend=counter, fullgraph=True)
    for seq in (24, 16, 40):
        h, targets = draw_batch(stack, batch=2, seq=seq)
        _, want = coda_loss(stack, h, targets)
        _, got = coda_loss(stack, h, targets, run=run)
        assert all(torch.equal(got[name], g) for name, g in want.items()), seq
    assert counter.frame_count == 2


def test_the_compiled_graphs_call_the_chains_kernels(small):
    """AOT autograd traces through the Functions: the forward graph holds the forward tasks, the backward
    graph the backward ones, in the chain's order (docs/llama3-chain.md)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    stack, h, targets = small
    seen: dict[str, list[str]] = {"forward": [], "backward": []}

    def recorder(kind: str):
        def compiler(gm: torch.fx.GraphModule, _inputs):
            seen[kind] += [str(n.target).split(".")[1].rsplit("_", 1)[0] for n in gm.graph.nodes
                           if n.op == "call_function" and str(n.target).startswith("coda.")]
            return make_boxed_func(gm)
        return compiler

    torch._dynamo.reset()
    coda_loss(stack, h, targets, run=torch.compile(stack, fullgraph=True, backend=aot_autograd(
        fw_compiler=recorder("forward"), bw_compiler=recorder("backward"))))
    layer_fw = ["gemm_rmsnorm_rope", "gemm_residual_rmsnorm", "gemm_rmsnorm_swiglu", "gemm_residual_rmsnorm"]
    layer_bw = ["gemm_swiglu_bwd", "gemm_rmsnorm_bwd", "rope", "gemm_rmsnorm_bwd"]  # rope: its backward pass
    # rms: the first norm's pass (rms_begin)
    assert seen["forward"] == ["rms", *layer_fw, *layer_fw, "gemm_rmsnorm_cross_entropy"]
    # no logits GEMM: the forward's are kept
    assert seen["backward"] == ["gemm_rmsnorm_bwd", *layer_bw, *layer_bw]


class _Ops(TorchDispatchMode):
    """Records the name of every op dispatched under it that :meth:`kept` keeps (all of them here)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = list[str]()

    def kept(self, func, outs) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.kept(func, out if isinstance(out, (tuple, list)) else (out,)):
            self.ops.append(func.name())
        return out


class _StreamPasses(_Ops):
    """Records the aten ops that write a tensor of at least ``size`` elements, views, GEMMs (``mm``: weight
    gradients, the o-projection's dgrad) and attention aside: the element-wise passes over the residual stream
    that run between the chain's kernels."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def kept(self, func, outs) -> bool:
        return (func.namespace == "aten" and not func.is_view and func is not torch.ops.aten.mm.default
                and "scaled_dot_product" not in func.name()
                and any(isinstance(o, torch.Tensor) and o.numel() >= self.size for o in outs))


@pytest.mark.parametrize("layers", [1, 3])
def test_no_element_wise_pass_over_the_stream_runs_per_layer(layers: int):
    """A training step's eager glue over stream-sized tensors is the final norm's zero ``dres`` alone, at any
    depth (the first norm's statistics are one pass of the chain's own, ``coda::rms_begin``): each layer's
    residual gradients meet inside ``gemm_rmsnorm_bwd`` (``dres``), not in an add of autograd's
    (docs/llama3-chain.md, B7)."""
    stack = make_stack(**{**SMALL, "layers": layers})
    h, targets = draw_batch(stack, batch=2, seq=24)
    x = h.detach().clone().requires_grad_()
    with _StreamPasses(size=h.numel()) as passes:
        stack(x, targets).backward()
    assert passes.ops == ["aten::zeros_like"]


def test_token_positions_are_made_once_for_every_layer_and_step():
    """RoPE's positions are the same for every layer and step of one batch shape: a step after the first makes
    none (an arange and a repeat a layer, two glue kernels each, until 2026-12-07)."""
    stack = make_stack(**{**SMALL, "layers": 2})
    h, targets = draw_batch(stack, batch=2, seq=24)
    stack(h, targets).backward()
    with _Ops() as seen:
        stack(h, targets).backward()
    assert not [op for op in seen.ops if op in ("aten::arange", "aten::repeat")]
    assert "coda::gemm_rmsnorm_rope" in " ".join(seen.ops)


def test_a_head_that_keeps_no_logits_recomputes_them_within_the_tolerance_rule(small, eager_run, truth):
    """``keep_logits=False``: the backward reruns the LM-head GEMM (``gemm_rmsnorm_cross_entropy_bwd``)."""
    stack, h, targets = small
    stack.head.keep_logits = False
    try:
        loss, grads = coda_loss(stack, h, targets)
    finally:
        stack.head.keep_logits = True
    _, eager = reference_loss(stack, h, targets, torch.bfloat16)
    assert torch.equal(loss, eager_run[0])
    assert_within_the_tolerance_rule(grads, truth[1], eager)
    for name, g in grads.items():  # the same math from the FP32 accumulator instead of the bf16 logits
        assert relative_error(g, eager_run[1][name]) < 2e-2, name


def test_a_second_backward_through_kept_logits_is_refused(small):
    """The backward overwrites the kept logits with dlogits: a second one must fail, not reuse them."""
    stack, h, targets = small
    x = h.detach().clone().requires_grad_()
    loss = stack(x, targets)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_an_all_ignored_batch_has_zero_loss_and_zero_gradients(small):
    stack, h, targets = small
    loss, grads = coda_loss(stack, h, torch.full_like(targets, IGNORE))
    assert float(loss) == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())


@pytest.mark.parametrize("task", CHAIN_TASKS)
def test_every_chain_op_passes_opcheck(task):
    """Schema, fake (meta) shapes and dtypes from the YAML, and tracing, against the kernel's real outputs."""
    t = find_task(task)
    dims = t.shape("small")[0].dims
    op = task_op(t)
    inputs = t.make_inputs(dims, seed=0)
    args = tuple(inputs[s.name] for s in t.inputs) + tuple(t.constants.values())
    torch.library.opcheck(op.op, args)


def test_fake_shapes_follow_the_symbolic_shapes_of_the_yaml():
    """``2*F`` only in an input's shape still binds F for the outputs (gemm_rmsnorm_swiglu's act is M x F)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    t = find_task("gemm_rmsnorm_swiglu")
    with FakeTensorMode():
        out = task_op(t)(x=torch.empty(10, 8, dtype=torch.bfloat16),
                         w=torch.empty(2 * 7, 8, dtype=torch.bfloat16), rstd=torch.empty(10))
    assert (out["act"].shape, out["preact"].shape) == ((10, 7), (10, 14))
    assert (out["act"].dtype, out["preact"].dtype) == (torch.bfloat16, torch.bfloat16)


def test_a_chosen_kernel_file_replaces_the_human_one(small, eager_run, tmp_path: Path):
    """A run's best.py is loaded as the human kernels are; the same algebra gives the same gradients."""
    stack, h, targets = small
    best = tmp_path / "best.py"
    best.write_text(find_task("gemm_swiglu_bwd").human_file.read_text()  # type: ignore[union-attr]
                    + "\n# a run's best, say\n")
    kernels = Kernels({"gemm_swiglu_bwd": best})
    assert kernels["gemm_swiglu_bwd"].source == best
    assert kernels["gemm_swiglu_bwd"].op is not Kernels()["gemm_swiglu_bwd"].op
    stack.use(kernels)
    try:
        _, grads = coda_loss(stack, h, targets)
    finally:
        stack.use(Kernels(scaled_exp_chunk=OWN_HEAD))
    assert all(torch.equal(grads[name], g) for name, g in eager_run[1].items())


def test_the_gradient_check_passes_the_human_kernels_and_names_what_a_wrong_one_breaks(small, tmp_path: Path):
    """``check_gradients`` (the end-to-end bench's check): every gradient within the rule on the human
    kernels; a SwiGLU backward whose dpreact is 3% off is caught in the MLP weights it feeds, by name."""
    stack, h, targets = small
    errors = check_gradients(stack, h, targets)
    assert {e.name for e in errors} == {*(n for n, _ in stack.named_parameters()), "h"}
    assert all(e.passed and 0 <= e.ratio <= 1 for e in errors)
    wrong = tmp_path / "wrong.py"
    wrong.write_text(find_task("gemm_swiglu_bwd").human_file.read_text().replace(  # type: ignore[union-attr]
        '{"dpreact": out["D"],', '{"dpreact": out["D"] * 1.03,'))
    stack.use(Kernels({"gemm_swiglu_bwd": wrong}))
    try:
        failed = {e.name for e in check_gradients(stack, h, targets) if not e.passed}
    finally:
        stack.use(Kernels(scaled_exp_chunk=OWN_HEAD))
    assert "layers.1.w_gate_up" in failed and "head.weight" not in failed


def test_k_major_dgrad_weights_give_the_same_gradients(small, eager_run):
    """``Kernels(k_major_dgrad=True)``: every dgrad GEMM reads a K-major copy of its weight; same values, same
    math."""
    stack, h, targets = small
    kernels = Kernels(k_major_dgrad=True)
    w = stack.head.weight.detach()
    assert kernels.dgrad_weight(w).stride() == (1, w.shape[0]) and torch.equal(kernels.dgrad_weight(w), w)
    stack.use(kernels)
    try:
        loss, grads = coda_loss(stack, h, targets)
    finally:
        stack.use(Kernels(scaled_exp_chunk=OWN_HEAD))
    assert torch.equal(loss, eager_run[0])
    for name, g in eager_run[1].items():
        # BLAS may block it otherwise
        assert torch.allclose(grads[name].float(), g.float(), rtol=1e-2, atol=1e-3), name


def test_the_scaled_exp_head_passes_the_tolerance_rule(small, truth):
    """``Kernels(scaled_exp_chunk=...)``: the LM head through the scaled-exp op and the element-wise norm
    backward (their CPU math; QuACK's kernels are the GPU's to judge, bench-e2e's gradient check), ignored
    tokens included, under the same rule as the chain's own head; and one graph under torch.compile."""
    stack, h, targets = small
    stack.use(Kernels(scaled_exp_chunk=128))
    try:
        loss, grads = coda_loss(stack, h, targets)
        torch._dynamo.reset()
        compiled_loss, compiled = coda_loss(stack, h, targets,
                                            run=torch.compile(stack, backend="aot_eager", fullgraph=True))
    finally:
        stack.use(Kernels(scaled_exp_chunk=OWN_HEAD))
    _, eager = reference_loss(stack, h, targets, torch.bfloat16)
    assert abs(float(loss) - float(truth[0])) <= 1e-2 * abs(float(truth[0]))
    assert_within_the_tolerance_rule(grads, truth[1], eager)
    assert torch.equal(compiled_loss, loss)
    for name, g in grads.items():
        assert torch.equal(compiled[name], g), name


def test_the_default_head_is_the_scaled_exp_one_where_quack_takes_it():
    """``Kernels()`` runs the scaled-exp head in 4096-row chunks (measured level or faster, and leaner, at
    the 1B and 8B shapes); the own head where a cross-entropy kernel file is given, or where QuACK's pipeline
    would refuse the head (not bf16, a vocabulary not of 128 columns); a chunk asked for is always given."""
    assert Kernels().scaled_exp_rows(128256, torch.bfloat16) == SCALED_EXP_CHUNK == 4096
    assert Kernels().scaled_exp_rows(128000 + 100, torch.bfloat16) is None
    assert Kernels().scaled_exp_rows(128256, torch.float16) is None
    assert Kernels().scaled_exp_rows(2**31 // 4096, torch.bfloat16) is None  # a chunk of 2^31 logits
    assert Kernels(scaled_exp_chunk=OWN_HEAD).scaled_exp_rows(128256, torch.bfloat16) is None
    assert Kernels(scaled_exp_chunk=8192).scaled_exp_rows(160, torch.float32) == 8192
    human = find_task("gemm_rmsnorm_cross_entropy").human_file
    assert Kernels({"gemm_rmsnorm_cross_entropy": human}).scaled_exp_rows(128256, torch.bfloat16) is None


def test_a_cross_entropy_kernel_file_beside_the_scaled_exp_head_is_refused():
    with pytest.raises(ValueError, match="the scaled-exp LM head runs no gemm_rmsnorm_cross_entropy: their"):
        Kernels({"gemm_rmsnorm_cross_entropy": "best.py"}, scaled_exp_chunk=4096)


@pytest.mark.parametrize(("rows", "dim", "chunk", "want"), [
    (32768, 2048, 4096, (4096, 0)),  # the 1B head: nothing to change
    (2048, 2048, 4096, (4096, 128)),  # one chunk of D rows: 128 ignored rows after it
    (16384, 4096, 4096, (8192, 0)),  # the 8B head's chunks of D rows: twice as large
    (16384, 16384, 16384, (16256, 0)),  # twice as large would pass 2^31 logits: a tile row fewer
    (4096 + 2048, 2048, 4096, (4096, 128)),  # a last chunk of D rows
    (2048, 2048, 32768, (32768, 128)),  # a short batch under a large chunk runs as one small chunk
])
def test_the_scaled_exp_chunks_avoid_what_quack_refuses(rows, dim, chunk, want):
    assert scaled_exp.chunking(rows, dim, 128256, chunk) == want


def test_a_scaled_exp_chunk_of_2_to_the_31_logits_is_refused():
    with pytest.raises(ValueError, match=r"a chunk of 32768 rows of a 128256-column vocabulary passes 2\^31 "
                                         r"logits, .* at most 16743 rows"):
        scaled_exp.chunking(32768, 2048, 128256, 32768)
    assert scaled_exp.chunking(16384, 2048, 128256, 16384) == (16384, 0)


@pytest.mark.parametrize("chunk", [0, 100])
def test_a_scaled_exp_chunk_not_of_128_rows_is_refused(chunk):
    with pytest.raises(ValueError, match="multiple of 128 rows"):
        Kernels(scaled_exp_chunk=chunk)


def test_a_kernel_for_a_task_outside_the_chain_is_refused():
    with pytest.raises(KeyError, match="not tasks of the Llama-3 chain"):
        Kernels({"gemm_rope": "best.py"})


def test_a_kernel_file_that_is_not_there_says_which(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"gemm_swiglu_bwd: no kernel file .*missing\.py"):
        Kernels({"gemm_swiglu_bwd": tmp_path / "missing.py"})


def test_a_kernel_whose_output_breaks_its_task_says_which(tmp_path: Path):
    bad = tmp_path / "best.py"
    bad.write_text(find_task("gemm_swiglu_bwd").human_file.read_text()  # type: ignore[union-attr]
                   + "\n_forward = forward\ndef forward(**kw):\n    out = _forward(**kw)\n"
                     "    return {**out, 'zdz': out['zdz'].half()}\n")
    t = find_task("gemm_swiglu_bwd")
    inputs = t.make_inputs(t.shape("small")[0].dims, seed=0)
    with pytest.raises(ValueError, match=r"output zdz is .* torch.float16, the task gives .* torch.float32"):
        task_op(t, bad)(**inputs)


def test_an_input_of_the_wrong_dtype_says_which():
    t = find_task("gemm_swiglu_bwd")
    inputs = t.make_inputs(t.shape("small")[0].dims, seed=0)
    with pytest.raises(TypeError, match=r"input dy is torch\.float32, the task takes bfloat16$"):
        task_op(t)(**{**inputs, "dy": inputs["dy"].float()})


def test_the_backend_follows_the_tensors_device():
    """CPU tensors run on the emulator whatever backend the process chose (here: compile-only QuACK)."""
    t = find_task("gemm_swiglu_bwd")
    inputs = t.make_inputs(t.shape("small")[0].dims, seed=0)
    want = task_op(t)(**inputs)
    with backend.using("quack-compile"):
        got = task_op(t)(**inputs)
        assert backend.active().name == "quack-compile"
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["own", "scaled-exp"])
def test_a_real_size_stack_on_the_gpu_passes_the_tolerance_rule(head):
    """Llama-3 1B's layer (dim 2048, ffn 8192, 32/8 heads), 2 layers, 2048 tokens, QuACK's kernels; the
    chain's own LM head and the default, QuACK's scaled-exp one (a chunk of D rows: 128 ignored rows
    added)."""
    kernels = Kernels(scaled_exp_chunk=OWN_HEAD) if head == "own" else Kernels()
    stack = make_stack(dim=2048, ffn=8192, heads=32, kv_heads=8, vocab=128256, layers=2, device="cuda",
                       kernels=kernels)
    h, targets = draw_batch(stack, batch=1, seq=2048)
    _, got = coda_loss(stack, h, targets)
    loss, truth = reference_loss(stack, h, targets, torch.float32)
    _, eager = reference_loss(stack, h, targets, torch.bfloat16)
    assert torch.isfinite(loss)
    assert_within_the_tolerance_rule(got, truth, eager)
