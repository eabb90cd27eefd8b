"""The QuACK backend: translate an :class:`Epilogue` into a ``quack.epilogue`` EpiMod and run it.

Imported lazily (only the harness selects it). Two flavours:

* ``quack``: a real launch (GPU) of a QuACK plan built once per call metadata, with one reused tile counter
  per stream (:func:`run`), reduces finalised as QuACK's eager call finalises them;
* ``quack-compile``: compile through ``EpiMod.plan`` without launching, so the sm_90a kernels of a candidate
  build on a CPU-only machine (:func:`.quack_patches.compile_only` sets the target for each plan, then
  restores it). The returned tensors have the right shapes and dtypes but no meaningful values.
"""

from __future__ import annotations

import functools
import importlib
from contextlib import nullcontext
from typing import Any

import torch

from ._call import GemmCall
from ._config import Config
from ._ops import ColVecLoad, ColVecReduce, ColVecSelect, OnlineLSEReduce, RowVecLoad, RowVecReduce
from .configs import DYNAMIC_SCHEDULER, kernel_config
from .quack_patches import compile_only, one_stage_mainloop_refused, split_k_plans

_QUACK_MODE = {"element": None, "acc_pair": "acc_pair", "packed": "packed_cd_b16x2"}


#: The modules this backend imports at its first call, a split-K call's buffers aside (the load-ahead
#: kernel's imports the CuTe DSL's).
FIRST_CALL_MODULES = ("quack.epilogue.ops", "quack.gemm_config", "quack.gemm_runtime.host",
                      f"{__package__}._ahead")


def preload() -> None:
    """Import :data:`FIRST_CALL_MODULES` now (:func:`.backend.preload`)."""
    for name in FIRST_CALL_MODULES:
        importlib.import_module(name)


def _epimod(call: GemmCall, ahead: bool) -> Any:
    """Build (once per Epilogue and kernel) the QuACK EpiMod with the same pins, sinks and mode; ``ahead``:
    one that mints the load-ahead kernel (:mod:`._ahead`)."""
    epi = call.epi
    # a statistic's eps is the kernel's constant: one EpiMod per eps the calls give
    cache_key = ("quack-ahead" if ahead else "quack", tuple((name, s.eps) for name, s in call.stats.items()))
    mod = epi.backend_cache.get(cache_key)
    if mod is not None:
        return mod
    from quack.epilogue import EpiMod
    from quack.epilogue import ops as q

    if ahead:
        from ._ahead import AheadEpiMod as EpiMod

    pins = {
        name: (q.ColVecLoad(name) if isinstance(pin, ColVecLoad) else q.RowVecLoad(name))
        for name, pin in epi.pins.items()
        if isinstance(pin, (ColVecLoad, RowVecLoad))
    }
    outs: dict[str, Any] = {}
    extra: list[Any] = []
    for name, sink in epi.sinks.items():
        if isinstance(sink, ColVecReduce):
            outs[name] = q.ColVecReduce(name, combine=sink.combine, scaled=sink.scaled)
        elif isinstance(sink, RowVecReduce):
            outs[name] = q.RowVecReduce(name, combine=sink.combine, scaled=sink.scaled)
        elif isinstance(sink, OnlineLSEReduce):
            outs[name] = q.OnlineLSEReduce(name)
        elif isinstance(sink, ColVecSelect):
            idx_op = q.ColVecLoad(sink.index)
            extra.append(idx_op)
            outs[name] = q.ColVecSelect(name, idx_op=idx_op)
    if call.stats:
        from quack.epilogue.head_rmsnorm import HeadRstd

        stats = {name: HeadRstd(name, eps=stat.eps) for name, stat in call.stats.items()}
        pins.update(stats)  # value ports the fn reads, fed by the prepass
        extra += [stats[param].out(out) for out, param in epi.stat_outputs.items()]
    mod = EpiMod(epi.fn, outputs=epi.outputs, ops=pins or None, outs=outs or None, mode=_QUACK_MODE[epi.mode],
                 extra_ops=tuple(extra), prepass=_squares(tuple(epi.stats)) if epi.stats else None,
                 prepass_outs=tuple(epi.stats))
    epi.backend_cache[cache_key] = mod
    return mod


def _squares(names: tuple[str, ...]) -> Any:
    """The accumulator prepass of :class:`~._ops.HeadRstd` statistics: each folds acc squared per (row,
    head), which QuACK's HeadRstd turns into ``rsqrt(mean + eps)``."""

    def squares(acc: Any) -> dict[str, Any]:
        return {name: acc * acc for name in names}

    return squares


@functools.cache
def _gemm_config(config: Config | None) -> Any:
    """One GemmConfig object per Config (None: the SM90 default), with the harness's scheduler: QuACK's eager
    call cache is keyed on the config's identity."""
    from quack.gemm_config import GemmConfig

    config = config or Config()
    return GemmConfig(
        tile_m=config.tile_m,
        tile_n=config.tile_n,
        cluster_m=config.cluster_m,
        cluster_n=config.cluster_n,
        pingpong=config.pingpong,
        is_dynamic_persistent=DYNAMIC_SCHEDULER,
        max_swizzle_size=config.max_swizzle_size,
        split_k=config.split_k,
    )


def _plan(mod: Any, call: GemmCall, out: dict[str, torch.Tensor], config: Any, kw: dict[str, Any]) -> Any:
    """``mod.plan`` with the config's split_k carried into it (:func:`.quack_patches.split_k_plans`), and a
    split that would leave QuACK's mainloop one A/B stage refused
    (:func:`.quack_patches.one_stage_mainloop_refused`)."""
    with split_k_plans(config.split_k) if config.split_k > 1 else nullcontext(), one_stage_mainloop_refused():
        return mod.plan(call.A, call.B, call.C, out=out, config=config, **kw)


def _operands(call: GemmCall) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Operands as QuACK takes them (a statistic's head width among them), plus the buffers of results QuACK
    does not finalise: NaN-filled ones for the select sinks, and the statistics returned."""
    kw: dict[str, Any] = {}
    for name, op in call.operands.items():
        kw[name] = op.value if op.kind == "scalar" else op.value.contiguous()
    kw.update(call.indices)
    kw.update({name: call.stat_width(name) for name in call.stats})  # a constexpr of the kernel
    written = {
        name: torch.full((call.m,), float("nan"), dtype=torch.float32, device=call.A.device)
        for name, sink in call.epi.sinks.items()
        if isinstance(sink, ColVecSelect)
    }
    written.update({out: torch.empty(call.m, call.n // call.stat_width(param), dtype=torch.float32,
                                     device=call.A.device) for out, param in call.epi.stat_outputs.items()})
    kw.update(written)
    return kw, written


def _plan_key(call: GemmCall, config: Any, kw: dict[str, Any]) -> tuple[Any, ...]:
    """What a QuACK plan is built from, as QuACK's own eager cache keys it: every tensor's metadata (not its
    data), whether each scalar is there (its value is a launch argument), the config object, and the device. A
    call from :func:`gemm` carries that metadata already (its signature)."""
    if call.signature is not None:
        return (id(config), call.A.get_device(), call.signature)

    def meta(t: torch.Tensor | None) -> Any:
        return None if t is None else (t.dtype, tuple(t.shape), t.stride())

    operands = tuple(sorted((name, meta(v) if isinstance(v, torch.Tensor)
                             else v is not None) for name, v in kw.items()))
    return (id(config), call.store_d, call.out_dtype, str(call.A.device), meta(call.A), meta(call.B),
            meta(call.C), operands)


def _tile_counter(device: torch.device) -> torch.Tensor:
    """The SM90 dynamic scheduler's tile counter for this device and stream, zeroed once and reused by every
    launch.

    The kernel's scheduler fetches the next tile with an ``atom.inc`` bounded by the tile count, so after its
    last fetch the counter is back at zero (``quack/tile_scheduler.py``; tests/test_gpu_primitives.py reads it
    after launches at several shapes and configs); a launch that never starts leaves it untouched. QuACK's
    eager call instead zero-fills a fresh counter before every launch: one more kernel per gemm call. One
    counter per stream, because only launches on one stream are ordered (with PDL the next kernel's scheduler
    waits for the previous grid before it fetches). Under CUDA graph capture a fresh one per call, as QuACK
    makes it: its zeroing is captured with the graph and replayed before each launch, while a cached one made
    there would never be zeroed outside the graph."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(1, dtype=torch.int32, device=device)
    key = _current_stream(device)
    counter = _TILE_COUNTERS.get(key)
    if counter is None:
        counter = _TILE_COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


def _current_stream(device: torch.device) -> tuple[int, int]:
    """(device index, stream id) of the device's current stream (``cuda`` without an index: the current
    device's): what ``torch.cuda.current_stream`` reads, without the Stream object it builds (a few µs of
    every launch)."""
    index = torch.cuda.current_device() if device.index is None else device.index
    stream_id, device_index, _ = torch._C._cuda_getCurrentStream(index)
    return device_index, stream_id


_TILE_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def run(call: GemmCall) -> dict[str, torch.Tensor]:
    """Launch the fused kernel (:func:`.configs.kernel_config`; no tuning) through a QuACK plan built once per
    call metadata, as QuACK's eager call replays its own, but with the reused :func:`_tile_counter`."""
    config = kernel_config(call)
    mod = _epimod(call, config.load_ahead)
    kw, written = _operands(call)
    config = _gemm_config(config)
    out = call.stored_buffers()
    plans = call.epi.backend_cache.setdefault("quack_plans", {})
    key = _plan_key(call, config, kw)
    entry = plans.get(key)
    # the plan, and whether its launch takes the SM90 tile counter (decided once, off the hot path)
    if entry is None:
        entry = plans[key] = (
            _plan(mod, call, out, config, kw),
            config.is_dynamic_persistent and torch.cuda.get_device_capability(call.A.device)[0] == 9,
        )
    plan, dynamic = entry
    # The reduce partials: fresh per call (a finalised reduce may be a view of them), as QuACK's eager call
    # does.
    scratch = {name: torch.empty_like(buf) for name, buf in plan.scratch.items() if name not in kw}
    _launch(plan, call, out, scratch, _tile_counter(call.A.device) if dynamic else None, kw)
    reduced = {name: mod._finalize_sink(name, buf, None, plan.gemm_plan) for name, buf in scratch.items()}
    return {**out, **reduced, **written}


def _launch(plan: Any, call: GemmCall, out: dict[str, torch.Tensor], scratch: dict[str, torch.Tensor],
            counter: torch.Tensor | None, kw: dict[str, Any]) -> None:
    """Launch a plan as ``EpiPlan.run`` does (the config never swaps A and B), minus its copies of the operand
    dicts, and with :func:`_split_k_buffers` in place of the fresh zero-filled split-K semaphore (one more
    kernel per call) QuACK makes for every split launch."""
    from quack.gemm_runtime.host import run_gemm_epi_plan

    B = call.B if plan.b_kn else call.B.mT
    values = {**scratch, **kw}
    for name in plan.out_names:
        if name in out:
            values[name] = out[name]
    split = _split_k_buffers(plan.gemm_plan, out["D"]) if plan.gemm_plan.split_k > 1 else None
    run_gemm_epi_plan(plan.gemm_plan, call.A, B, out.get("D"), call.C, values, tile_count_semaphore=counter,
                      split_k_buffers=split)


def _split_k_buffers(gemm_plan: Any, D: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A serial split-K launch's turnstile flags and FP32 partials, made once per stream and geometry and
    reused: the last split of each tile sets its flag back to zero and the first split overwrites its partials
    (``quack/gemm_base.py``, ``epilogue_split_k``), so the next launch on the same stream finds them as new.
    Under CUDA graph capture None: QuACK makes them fresh, their zeroing captured with the graph (as
    :func:`_tile_counter`)."""
    if torch.cuda.is_current_stream_capturing():
        return None
    from quack.gemm import _split_k_buffers as make

    p = gemm_plan
    D = (D.mT if p.d_transposed else D)[None]
    geometry = (tuple(D.shape), int(p.split_k_mode), p.tile_M, p.tile_N, p.cluster_M, p.cluster_N,
                p.is_sm100_family)
    key = (*_current_stream(D.device), geometry)
    buffers = _SPLIT_K_BUFFERS.get(key)
    if buffers is None:
        buffers = _SPLIT_K_BUFFERS[key] = make(D, *geometry[1:])
    return buffers


#: By stream and what sizes them (plans of the same geometry on one stream share them: its launches are
#: ordered).
_SPLIT_K_BUFFERS: dict[tuple[int, int, tuple[Any, ...]], tuple[torch.Tensor, torch.Tensor]] = {}


def run_compile_only(call: GemmCall) -> dict[str, torch.Tensor]:
    """Compile the kernel for sm_90a (or the arch the environment names) without launching it (no GPU
    needed)."""
    with compile_only():
        config = kernel_config(call)
        mod = _epimod(call, config.load_ahead)
        kw, written = _operands(call)
        out, reduced = call.zero_results()
        _plan(mod, call, out, _gemm_config(config), kw)
    return {**out, **reduced, **written}

