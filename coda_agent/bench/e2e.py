"""``coda-agent bench-e2e``: a Llama-3 layer stack's training step (forward + backward) on the task kernels
against the same model in plain PyTorch, eager and under torch.compile.

Every variant runs the same weights and batch. Each variant's first step runs alone (its compiles), then the
steps are timed interleaved (``measure.timing.time_interleaved``); the attention part, torch's SDPA in every
variant, is timed alone at the stack's shapes, and ``non-attention time = step - layers x attention``: the
part the task kernels replace. The step's GEMM products alone on cuBLAS (``gemm_floor_step``) are timed
with them: the floor that non-attention time stands against. Then one step per variant for its peak memory,
one with the allocator's trace recorded for what is alive at that peak (``memory_peak``), one under
``torch.profiler`` for the kernels that made the difference and the GPU's idle time between them, and a few
back to back for the joules a step (``measure.energy``; under the power cap a step's energy paces it too).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..measure.energy import energy_counter, energy_per_step
from ..measure.timing import Clock, RepPlan, time_interleaved
from ..provenance import driver_version, git_commit, package_versions
from ..torch import CodaLlamaLayer, CodaLlamaStack, CodaLMHead, Kernels, ReferenceLlamaStack
from ..torch.check import check_gradients
from ..torch.layer import IGNORE_INDEX
from .memory_peak import record_peak
from .results import (
    ATTENTION_KIND,
    CUDA_KERNELS,
    E2EConfig,
    E2ERun,
    E2EVariant,
    GemmProduct,
    GpuTimeline,
    GradientCheck,
    KernelFile,
    KernelGap,
    KernelKind,
    KernelTime,
)

#: CODA's torchtitan 1B (Llama 3.2 1B: 16 layers, vocab 128256) at batch 4 x 8192, Llama 3.1 8B's layers (32
#: of them; time a few with --layers) at batch 2 x 8192, and a CPU-sized one for tests.
PRESETS = {
    "1b": E2EConfig(preset="1b", dim=2048, ffn_dim=8192, n_heads=32, n_kv_heads=8, vocab=128256, layers=16,
                    batch=4, seq=8192),
    "8b": E2EConfig(preset="8b", dim=4096, ffn_dim=14336, n_heads=32, n_kv_heads=8, vocab=128256, layers=32,
                    batch=2, seq=8192),
    "tiny": E2EConfig(preset="tiny", dim=64, ffn_dim=96, n_heads=4, n_kv_heads=2, vocab=160, layers=2,
                      batch=2, seq=32),
}
MAX_AUTOTUNE = "max-autotune-no-cudagraphs"
#: How a run's note begins when Ctrl-C or a timeout's SIGTERM stopped it after the timing.
CUT_SHORT = "cut short"


@dataclass(frozen=True)
class VariantSpec:
    """A variant: which model, torch.compile's mode around it (None: eager) and the GEMM backends Inductor may
    autotune over in that mode (None: the mode's own), and, for CODA's, whether its dgrad GEMMs read K-major
    copies of the weights (``Kernels(k_major_dgrad=True)``), its LM head (``Kernels``'s ``scaled_exp_chunk``:
    the scaled-exp head by default, None for the chain's own), and whether the kernel files given to the run
    replace the human kernels of their tasks."""

    name: str
    coda: bool
    compile_mode: str | None
    gemm_backends: str | None = None
    k_major_dgrad: bool = False
    scaled_exp_chunk: int | Literal["default"] | None = "default"
    chosen_kernels: bool = False


VARIANTS = {
    spec.name: spec
    for spec in (
        VariantSpec("coda", coda=True, compile_mode=None),
        VariantSpec("coda-compile", coda=True, compile_mode="default"),
        VariantSpec("coda-kmajor", coda=True, compile_mode=None, k_major_dgrad=True),
        # the chain's own head (logits kept, one softmax-gradient pass, the cross-entropy tasks' kernels), and
        # the scaled-exp head at the most rows of a 128k vocabulary its glue can index (2^31 values)
        VariantSpec("coda-own-head", coda=True, compile_mode=None, scaled_exp_chunk=None),
        VariantSpec("coda-scaled-exp-16k", coda=True, compile_mode=None, scaled_exp_chunk=16384),
        VariantSpec("coda-kernels", coda=True, compile_mode=None, chosen_kernels=True),
        VariantSpec("eager", coda=False, compile_mode=None),
        VariantSpec("compile", coda=False, compile_mode="default"),
        VariantSpec("compile-max-autotune", coda=False, compile_mode=MAX_AUTOTUNE),
        # max-autotune's tuning of every pointwise and reduction kernel, its GEMMs left to cuBLAS: its Triton
        # GEMM templates fault at the 1B head (MAX_AUTOTUNE_LOGITS) and lost to cuBLAS at every other GEMM of
        # the stack they were timed at (H100, bench/results/h100-2026-12-06-h-e2e.log: 0.76-0.79x at best)
        VariantSpec("compile-max-autotune-cublas", coda=False, compile_mode=MAX_AUTOTUNE,
                    gemm_backends="ATEN"),
    )
}
DEFAULT_VARIANTS = ("coda", "eager", "compile")
#: Logits (tokens x vocabulary) from which max-autotune's build of the stack faults: Inductor's autotuning of
#: the LM head's Triton GEMM hit an illegal memory access at 32768 x 128256 (4.2e9 values; torch 2.11, H100,
#: bench/results/h100-2026-12-06-h-e2e.log), which ends the process. Below 2^31 it was not seen to.
MAX_AUTOTUNE_LOGITS = 2**31
#: The GEMM floor's name among the timed steps (:func:`gemm_floor_step`).
FLOOR = "GEMM floor"
#: The variant that runs the kernel files a run is given (``kernel_files``) in place of the human kernels.
CHOSEN = "coda-kernels"


def compiled_model(model: nn.Module, spec: VariantSpec,
                   backend: str) -> tuple[Callable[..., torch.Tensor], tuple[str, str | None]]:
    """``model`` under torch.compile as ``spec`` says, and (backend, the mode as the results name it). The
    mode and its GEMM backends are Inductor's; torch.compile takes a mode or options, not both, so a variant
    that narrows the backends passes the mode's own options with that one changed."""
    if backend != "inductor" or spec.compile_mode is None:
        return torch.compile(model, backend=backend, fullgraph=True), (backend, None)
    if spec.gemm_backends is None:
        return torch.compile(model, backend=backend, mode=spec.compile_mode, fullgraph=True), (
            backend, spec.compile_mode)
    options = {**torch._inductor.list_mode_options(spec.compile_mode),
               "max_autotune_gemm_backends": spec.gemm_backends}
    return torch.compile(model, backend=backend, options=options, fullgraph=True), (
        backend, f"{spec.compile_mode}, GEMM backends {spec.gemm_backends}")


def compile_backend(device: str) -> str:
    """Inductor on a GPU; on a CPU ``aot_eager`` (the same graphs through AOT autograd, run eagerly), since
    Inductor's CPU build of even the tiny stack takes tens of seconds and its CPU kernels say nothing of a
    GPU's."""
    return "inductor" if device == "cuda" else "aot_eager"


def build_stack(config: E2EConfig, device: str, seed: int = 0) -> CodaLlamaStack:
    torch.manual_seed(seed)
    kernels = Kernels()
    layers = [CodaLlamaLayer(config.dim, config.ffn_dim, config.n_heads, config.n_kv_heads, kernels=kernels,
                             device=device)
              for _ in range(config.layers)]
    return CodaLlamaStack(layers, CodaLMHead(config.dim, config.vocab, kernels=kernels, device=device))


def on_kernels(stack: CodaLlamaStack, kernels: Kernels,
               run: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``run`` with ``stack`` on ``kernels`` for the call (its backward included: it reads them from the
    forward)."""

    def call(*args: torch.Tensor) -> torch.Tensor:
        stack.use(kernels)
        return run(*args)

    return call


def training_step(model: nn.Module, run: Callable[..., torch.Tensor], h: torch.Tensor,
                  targets: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One step as a trainer runs it: gradients cleared, loss forward, backward to every weight and the
    input."""

    def step() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = run(h.detach().requires_grad_(), targets)
        loss.backward()
        return loss

    return step


def attention_step(config: E2EConfig, device: str) -> Callable[[], None]:
    """One layer's attention alone, forward + backward: SDPA (causal, GQA) on Q/K/V that are (B, heads, S, d)
    views of one QKV tensor, as the layers hand them over, with the gradient of its output in the layers'
    layout. The gradients are returned where SDPA leaves them: gathering them into one tensor is the layers'
    work (CODA's RoPE backward reads them in place), not attention's."""
    b, s, nq, nkv, d = (
        config.batch,
        config.seq,
        config.n_heads,
        config.n_kv_heads,
        config.dim // config.n_heads,
    )
    qkv = torch.randn(b, s, nq + 2 * nkv, d, device=device, dtype=torch.bfloat16)
    q, k, v = (t.transpose(1, 2).requires_grad_() for t in qkv.split([nq, nkv, nkv], dim=2))
    grad = torch.randn(b, s, nq, d, device=device, dtype=torch.bfloat16).transpose(1, 2)

    def step() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=nq != nkv)
        torch.autograd.grad(out, (q, k, v), grad)

    return step


def _weights(config: E2EConfig) -> list[tuple[str, int, int, int]]:
    """The step's GEMM weights, ``nn.Linear``-shaped: (name, out features, in features, how many a step)."""
    c = config
    qkv = (c.n_heads + 2 * c.n_kv_heads) * (c.dim // c.n_heads)
    layers = [("qkv", qkv, c.dim), ("o", c.dim, c.dim), ("gate/up", 2 * c.ffn_dim, c.dim),
              ("down", c.dim, c.ffn_dim)]
    return [(name, out, inp, c.layers) for name, out, inp in layers] + [("head", c.vocab, c.dim, 1)]


def gemm_products(config: E2EConfig) -> list[GemmProduct]:
    """Every GEMM product of one training step, as the plain-PyTorch model runs them: per layer the QKV, o,
    gate/up and down projections' forward (``x @ W.T``), input gradient (``dy @ W``) and weight gradient
    (``dy.T @ x``), and the LM head's three. Attention's own products (SDPA's) are not among them."""
    t = config.tokens
    products = []
    for name, out, inp, count in _weights(config):
        products += [GemmProduct(name=f"{name} forward", m=t, n=out, k=inp, count=count),
                     GemmProduct(name=f"{name} input gradient", m=t, n=inp, k=out, count=count),
                     GemmProduct(name=f"{name} weight gradient", m=out, n=inp, k=t, count=count)]
    return products


def gemm_floor_step(config: E2EConfig, device: str) -> Callable[[], None]:
    """The step's GEMM products alone (:func:`gemm_products`), back to back on cuBLAS in the layouts autograd
    gives them (weights ``nn.Linear``-shaped, activations row-major), each its ``count`` times. One (tokens x
    out) buffer is each forward's output and its input gradient's operand; the values are random at the
    model's scale (the tensor cores' power draw follows them)."""
    g = torch.Generator(device=device).manual_seed(3)

    def random(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=torch.bfloat16).mul_(scale)

    buffers = []
    for _, out, inp, count in _weights(config):
        w, x = random(out, inp, scale=inp**-0.5), random(config.tokens, inp)
        y = x.new_empty(config.tokens, out)
        buffers.append((count, w, x, y, torch.empty_like(x), torch.empty_like(w)))

    def step() -> None:
        for count, w, x, y, dx, dw in buffers:
            for _ in range(count):
                torch.mm(x, w.t(), out=y)
                torch.mm(y, w, out=dx)
                torch.mm(y.t(), x, out=dw)

    return step


def first_steps(steps: dict[str, Callable[[], torch.Tensor]], progress: Callable[[str], None]) -> dict[str,
                                                                                                       str]:
    """Each variant's first step alone (its compiles); returns the variants that ran out of memory, with why,
    so one model too big for the device costs its own row, not the run."""
    dropped = {}
    for name, step in steps.items():
        progress(f"first step (compiles): {name}")
        try:
            step()
        except torch.OutOfMemoryError as exc:
            dropped[name] = "out of memory: " + str(exc).splitlines()[0]
            torch.cuda.empty_cache()
    return dropped


def peak_memory(step: Callable[[], torch.Tensor], device: str,
                models: Iterable[nn.Module] = ()) -> tuple[torch.Tensor, int | None, int | None]:
    """(loss, peak bytes, resident bytes) of one step; the byte counts only on a GPU. Every one of ``models``
    drops its gradients first, so that the resident bytes are the weights and the batch whichever variant
    ran last (the gradient check drops CODA's, a compiled step keeps the reference's)."""
    for model in models:
        model.zero_grad(set_to_none=True)
    if device != "cuda":
        return step().detach(), None, None
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = step().detach()
    torch.cuda.synchronize()
    return loss, torch.cuda.max_memory_allocated(), resident


#: What a profiled kernel (on a CPU, op) is, by its name: the first kind whose pattern it matches, else
#: :data:`OTHER`. Attention first (cuDNN's and flash's names hold "gemm"-like words; cuDNN's backward ends in
#: ``convert_dq_to_16bits``), then the task kernels (QuACK's CuTe DSL GEMMs with their epilogues, or their
#: ops), the chain's glue passes (:mod:`coda_agent.torch.glue`'s Triton kernels, and QuACK's scaled-exp
#: head's), any other GEMM (cuBLAS's, aten's), and Inductor's Triton kernels.
KERNEL_KINDS = (
    (ATTENTION_KIND, re.compile(r"sdpa|flash|fmha|attention|compute_dot_do_o|convert_dq", re.IGNORECASE)),
    ("task kernels (GEMM + epilogue)", re.compile(r"GemmMod|^coda::gemm_")),
    ("the chain's glue passes", re.compile(
        r"softmax_grad|rope_backward|rms_begin|rms_normalize|rmsnorm_backward|scale_cast|_lce_glue|^coda::")),
    ("other GEMMs (cuBLAS, aten)", re.compile(r"nvjet|xmma|gemm|cublas|^aten::(mm|addmm|bmm|matmul)$",
                                        re.IGNORECASE)),
    ("Inductor's Triton kernels", re.compile(r"^triton_")),
)
#: Everything else: element-wise kernels, copies, fills, reductions.
OTHER = "element-wise, copies, fills, other"


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), OTHER)


def by_kind(rows: list[tuple[str, int, float]]) -> list[KernelKind]:
    """(name, count, µs) rows summed by :func:`kernel_kind`, largest first."""
    sums: dict[str, KernelKind] = {}
    for name, count, us in rows:
        kind = kernel_kind(name)
        got = sums.get(kind, KernelKind(kind=kind, count=0, total_us=0.0))
        sums[kind] = KernelKind(kind=kind, count=got.count + count, total_us=got.total_us + us)
    return sorted(sums.values(), key=lambda k: -k.total_us)


#: The gaps a timeline names, longest first.
LONGEST_GAPS = 8


def measured(variant: E2EVariant, **fields: object) -> E2EVariant:
    """``variant`` with one more measure in it."""
    return variant.model_copy(update=fields)


def gpu_timeline(kernels: Iterable[tuple[float, float, str]],
                 longest: int = LONGEST_GAPS) -> GpuTimeline | None:
    """The timeline of one step's kernels, each (start µs, end µs, name): how long the GPU was busy between
    the first start and the last end, and where it sat idle (each gap ended by the next kernel to start, after
    the last one to end before it). None without kernels."""
    ordered = sorted(kernels)
    if not ordered:
        return None
    first, reach, last = ordered[0][0], ordered[0][1], ordered[0][2]
    run_start, busy = first, 0.0
    gaps: list[KernelGap] = []
    for start, end, name in ordered[1:]:
        if start > reach:
            gaps.append(KernelGap(us=start - reach, before=last, after=name))
            busy += reach - run_start
            run_start = start
        if end >= reach:
            reach, last = end, name
    busy += reach - run_start
    return GpuTimeline(span_us=reach - first, busy_us=busy,
                       idle_by_next_kind=by_kind([(g.after, 1, g.us) for g in gaps]),
                       longest=sorted(gaps, key=lambda g: -g.us)[:longest])


@dataclass(frozen=True)
class Profile:
    """What one step spends its time in (:func:`profile_kernels`)."""

    measured: str  #: what was counted: CUDA kernels, or CPU ops without a GPU
    total_us: float
    top: list[KernelTime]
    by_kind: list[KernelKind]
    timeline: GpuTimeline | None  #: None on a CPU


def profile_kernels(step: Callable[[], object], device: str, top: int) -> Profile:
    """What one step spends its time in: the ``top`` kernels by total time, every one by kind and, on a GPU,
    the step's timeline. On a GPU the CUDA kernels; on a CPU the ops' self time (there are no kernels)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    timeline = None
    if device == "cuda":
        kind = CUDA_KERNELS
        rows = [(e.key, e.count, e.device_time_total) for e in prof.key_averages()
                if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0]
        timeline = gpu_timeline((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                                if e.device_type == torch.autograd.DeviceType.CUDA)
    else:
        kind = "CPU ops (self time; no GPU)"
        rows = [(e.key, e.count,
                 e.self_cpu_time_total) for e in prof.key_averages() if e.self_cpu_time_total > 0]
    rows.sort(key=lambda r: -r[2])
    top_rows = [KernelTime(name=n, count=c, total_us=t) for n, c, t in rows[:top]]
    return Profile(kind, sum(r[2] for r in rows), top_rows, by_kind(rows), timeline)


#: The tokens of the gradient check's batch (one sequence): enough for every kernel's tiles at the model's
#: real widths, small enough that the FP32 reference fits beside the bench's models.
GRADIENT_CHECK_TOKENS = 2048


def gradient_batch(config: E2EConfig, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of up to :data:`GRADIENT_CHECK_TOKENS` tokens, with about 1 target in 5 ignored (the
    loss's other path)."""
    g = torch.Generator().manual_seed(2)
    seq = min(config.seq, GRADIENT_CHECK_TOKENS)
    h = torch.randn(1, seq, config.dim, generator=g).to(device=device, dtype=torch.bfloat16)
    targets = torch.randint(0, config.vocab, (1, seq), generator=g)
    targets[torch.rand(1, seq, generator=g) < 0.2] = IGNORE_INDEX
    return h, targets.to(device)


def gradient_check(stack: CodaLlamaStack, kernels: Kernels, h: torch.Tensor,
                   targets: torch.Tensor) -> GradientCheck:
    """``stack`` on ``kernels``: its gradients at this batch against FP32 autograd, by the tolerance rule."""
    stack.use(kernels)
    errors = check_gradients(stack, h, targets)
    stack.zero_grad(set_to_none=True)
    worst = max(errors, key=lambda e: e.ratio)
    return GradientCheck(tokens=h.shape[0] * h.shape[1], passed=all(e.passed for e in errors),
                         worst=worst.name, worst_ratio=worst.ratio,
                         failed=[e.name for e in errors if not e.passed])


def step_plan(warmup: int = 3, steps: int = 20) -> RepPlan:
    """Exactly ``steps`` timed steps per variant after ``warmup`` (a step is long: no sizing to a time
    target)."""
    return RepPlan(warmup=warmup, min_reps=steps, max_reps=steps)


def timing_method(device: str, plan: RepPlan) -> str:
    clock = (
        "CUDA events on the current stream, L2 flushed before each step"
        if device == "cuda"
        else "the host clock (no GPU)"
    )
    return (f"{clock}; one step = zero_grad, forward, loss.backward(); a first step of each variant alone "
            f"(compiles), then the variants interleaved step by step in rotating order after {plan.warmup} "
            f"untimed steps each; median and p10/p90 over "
            f"{plan.min_reps} steps")


def run_e2e(config: E2EConfig, *, device: str, command: str, device_name: str | None = None,
            variants: Iterable[str] = DEFAULT_VARIANTS, plan: RepPlan | None = None,
            top: int = 15, kernel_files: Mapping[str, Path] | None = None, gradients: bool = True,
            progress: Callable[[str], None] = lambda _: None) -> E2ERun:
    """Build the stack, time every variant's step and the attention alone, measure memory and profile each.

    ``device`` is ``cuda`` or ``cpu`` (tests: the emulator backend and the tiny preset); the CODA variant is
    always measured, as every ratio is to it. ``kernel_files`` (chain task -> kernel file, e.g. a run's
    ``best.py``) adds the ``coda-kernels`` variant: CODA with those files in place of their tasks' human
    kernels, timed beside the human ones. ``gradients``: each eager CODA variant's gradients are checked at
    one short sequence against FP32 autograd (:func:`gradient_check`), after the timing.
    """
    plan = plan or step_plan()
    kernel_files = dict(kernel_files or {})
    names = ["coda", *(v for v in variants if v != "coda")]
    if kernel_files and CHOSEN not in names:
        names.insert(1, CHOSEN)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    logits = config.tokens * config.vocab
    if device == "cuda" and "compile-max-autotune" in names and logits >= MAX_AUTOTUNE_LOGITS:
        raise ValueError(f"compile-max-autotune cannot build this stack: Inductor's autotuning of the LM "
                         f"head's GEMM faults at {logits:,} logits ({config.tokens:,} tokens x "
                         f"{config.vocab:,}) and ends the run; keep the logits under 2^31 (--batch or "
                         "--seq), or time compile-max-autotune-cublas (the same mode, its GEMMs on cuBLAS)")
    if CHOSEN in names and not kernel_files:
        raise ValueError(f"the {CHOSEN} variant runs the kernel files it is given, and none was given")
    chosen = Kernels(kernel_files)  # imports them: a file that is not a chain task's kernel fails here
    backend = compile_backend(device)
    coda = build_stack(config, device)
    reference = ReferenceLlamaStack.like(coda)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(config.batch, config.seq, config.dim, generator=g).to(device=device, dtype=torch.bfloat16)
    targets = torch.randint(0, config.vocab, (config.batch, config.seq), generator=g).to(device)

    steps: dict[str, Callable[[], torch.Tensor]] = {}
    compiled: dict[str, tuple[str, str | None]] = {}  # name -> (backend, mode)
    kernel_sets = {name: chosen if VARIANTS[name].chosen_kernels else
                   Kernels(k_major_dgrad=VARIANTS[name].k_major_dgrad,
                           scaled_exp_chunk=VARIANTS[name].scaled_exp_chunk)
                   for name in names if VARIANTS[name].coda}
    for name in names:
        spec = VARIANTS[name]
        model: nn.Module = coda if spec.coda else reference
        run: Callable[..., torch.Tensor] = model
        if spec.compile_mode is not None:
            run, compiled[name] = compiled_model(model, spec, backend)
        if spec.coda:  # the CODA variants share one stack's weights: each step sets its kernels first
            run = on_kernels(coda, kernel_sets[name], run)
        steps[name] = training_step(model, run, h, targets)
    dropped = first_steps(steps, progress)
    if "coda" in dropped:
        raise ValueError(f"the coda variant cannot run at this size ({dropped['coda']}): try fewer --layers, "
                         "--batch or --seq")
    names = [n for n in names if n not in dropped]
    attention = attention_step(config, device)
    progress(f"timing {', '.join(names)}, the attention alone and the GEMM floor, interleaved")
    timings = time_interleaved({**{n: steps[n] for n in names}, "attention": attention,
                                FLOOR: gemm_floor_step(config, device)}, Clock(device), plan)
    attention_us = timings["attention"].median_us * config.layers

    check_batch = gradient_batch(config, device) if gradients else None
    meter = energy_counter(torch.cuda.current_device()) if device == "cuda" else None
    results: dict[str, E2EVariant] = {}
    for name in names:
        spec, step_t = VARIANTS[name], timings[name]
        results[name] = E2EVariant(
            name=name, model="CodaLlamaStack" if spec.coda else "ReferenceLlamaStack",
            compile_backend=compiled[name][0] if name in compiled else None,
            compile_mode=compiled[name][1] if name in compiled else None,
            step=step_t, tokens_per_s=config.tokens / (step_t.median_us * 1e-6),
            non_attention_us=step_t.median_us - attention_us)
    cut, failures = None, []
    try:  # each measure lands in its variant as it is taken: a run cut short keeps what it measured
        for name in names:
            spec = VARIANTS[name]
            progress(f"memory and profile: {name}")
            loss, peak, resident = peak_memory(steps[name], device, (coda, reference))
            results[name] = measured(results[name], loss=float(loss), peak_memory_bytes=peak,
                                     resident_bytes=resident)
            if device == "cuda":
                results[name] = measured(results[name], peak_breakdown=record_peak(steps[name]))
            profiled = profile_kernels(steps[name], device, top)
            results[name] = measured(results[name], kernels_measured=profiled.measured,
                                     kernel_total_us=profiled.total_us, top_kernels=profiled.top,
                                     by_kind=profiled.by_kind, timeline=profiled.timeline)
            if meter is not None:
                results[name] = measured(results[name],
                                         energy=energy_per_step(steps[name], meter, torch.cuda.synchronize))
            if check_batch is not None and spec.coda and spec.compile_mode is None:
                progress(f"gradients against FP32 autograd: {name}")
                try:
                    results[name] = measured(results[name], gradients=gradient_check(
                        coda, kernel_sets[name], *check_batch))
                except (RuntimeError, ValueError) as error:  # the timing and the other variants still stand
                    failures.append(f"{name}'s gradients could not be checked: {str(error).splitlines()[0]}")
                    progress(failures[-1])
    except KeyboardInterrupt:  # Ctrl-C, or the SIGTERM of a timeout (the CLI makes it one)
        cut = (f"{CUT_SHORT} while measuring {name} after the timing: what was measured is kept, the rest "
               "absent")
        progress(cut)
    notes = [f"{name} was left out: {why}" for name, why in dropped.items()] + failures
    notes += [cut] if cut else []
    if backend != "inductor":
        notes.append(f"no GPU: the torch.compile variants ran backend {backend} without a mode (Inductor's "
                     "CPU build takes tens of seconds and says nothing of a GPU); the times only show the "
                     "bench runs")
    return E2ERun(
        created=datetime.now(timezone.utc), command=command, device=device_name or device,
        driver=driver_version(), packages=package_versions(), git_commit=git_commit(),
        timing_method=timing_method(device, plan),
        attention_method=(f"non-attention time = step median - {config.layers} layers x the median of one "
                          "layer's SDPA forward+backward timed alone, interleaved with the steps (causal, "
                          "GQA, Q/K/V as views of one QKV tensor as in the layers; their gradients left "
                          "where SDPA writes them)"),
        notes=notes, config=config, attention=timings["attention"], variants=list(results.values()),
        gemm_floor=timings[FLOOR], gemm_products=gemm_products(config),
        kernel_files=[KernelFile(task=task, path=str(path),
                                 sha256=hashlib.sha256(Path(path).read_bytes()).hexdigest())
                      for task, path in sorted(kernel_files.items())],
    )
