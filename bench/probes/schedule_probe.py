"""Issue 9's GPU probe: where the human kernels' schedules lose time, measured one variable at a time.

For each (task, shape) row it times, interleaved with the bench's protocol (CUDA events, L2 flushed, rotating
order), the human kernel as written, the same kernel with QuACK's dynamic persistent scheduler, its plain twin (the same
GEMMs at the same configs with no epilogue: :func:`plain_twin`), optionally every
config of a small sweep with and without it, the task's GEMMs through cuBLAS, QuACK's plain GEMM, and, for the
SwiGLU backward, QuACK's own dedicated dgated path (``gemm_dact``; with ``--sweep``, at each config of the sweep
too). ``--ncu`` instead runs each variant of one
row once between cudaProfilerStart/Stop, for ``ncu --profile-from-start off``.

It is a probe, not the bench: nothing here goes through the sandboxed verifier, and what it finds becomes a default
in ``coda_agent/primitives`` only after ``coda-agent bench`` measures it. GPU only, with the project root on
PYTHONPATH (``source .gpu2/env.sh``):

    python3 bench/probes/schedule_probe.py --row gemm_swiglu_bwd --sweep gemm_swiglu_bwd --json probe.json
    python3 bench/probes/schedule_probe.py --precompile 0/8 ...   # build one eighth of the kernels, time nothing
    python3 bench/probes/schedule_probe.py --row gemm_swiglu_bwd --variant bench/probes/variants/swiglu_bwd_two_folds.py
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import steady
import torch

from coda_agent.measure.baselines import cublas_gemms
from coda_agent.measure.timing import Clock, RepPlan, paired_ratio, time_interleaved
from coda_agent.primitives import Config, _ahead, _quack, backend
from coda_agent.primitives import configs as configs_module
from coda_agent.primitives.configs import chosen_config, config_from_fields
from coda_agent.tasks.loader import find_task, import_file

#: The configs of ``--sweep``, both clusters each: QuACK's SM90 space for gated epilogues (tile_n % 32 == 0), and
#: 128x208, which only element mode takes (a variant QuACK refuses is left out with its reason).
SWEEP = [Config(tile_m=m, tile_n=n, pingpong=pp, cluster_m=cm, cluster_n=cn)
         for m, n, pp in ((128, 128, True), (128, 160, True), (128, 192, True), (256, 128, False), (256, 192, False),
                          (128, 256, False), (128, 208, True))
         for cm, cn in ((2, 1), (1, 2))]
#: The tiles every split variant also runs with (besides the kernel's own): the two that the wave model trades.
SPLIT_TILES = [Config(tile_n=192), Config(tile_n=128)]
STATE: dict[str, Any] = {"dynamic": False, "config": None, "split": None, "calls": None, "ahead": False,
                         "override": None}
#: A row whose input set takes more than this is built (``--precompile``) at its task's first small shape:
#: QuACK's kernels do not depend on the sizes, and at the LM head's dgrad (8.6 GiB of inputs, up to 48 GiB a
#: builder with its variants) the builders ran out of memory (h100-2026-12-06-g). Only a config pinned at the
#: row's own shape is then left for the timing run to build.
PRECOMPILE_ROW_BYTES = 2 << 30
#: Each epilogue's copy per load-ahead class of ``--ahead-kernel``: a copy has a backend cache of its own, so the
#: class's kernels are built and cached apart from the load-ahead kernel's.
EPI_COPIES: dict[tuple[int, type], Any] = {}


@functools.cache
def _gemm_config(config: Config | None, dynamic: bool) -> Any:
    from quack.gemm_config import GemmConfig

    c = config or Config()
    return GemmConfig(tile_m=c.tile_m, tile_n=c.tile_n, cluster_m=c.cluster_m, cluster_n=c.cluster_n,
                      pingpong=c.pingpong, is_dynamic_persistent=dynamic, max_swizzle_size=c.max_swizzle_size,
                      split_k=c.split_k)


def _forced(run: Callable[..., Any]) -> Callable[..., Any]:
    """The QuACK backend with the probe's config (if any) over the kernel's own, and its split_k (if any) over
    either."""
    def go(call: Any) -> Any:
        if STATE["calls"] is not None:
            STATE["calls"].append(call)
        if STATE["config"] is not None:  # over a @schedule's pin too, which would win over config=
            call = dataclasses.replace(call, config=STATE["config"], pinned=None)
        if STATE["override"] is not None:  # fields of --override over the call's own config
            config = dataclasses.replace(chosen_config(call) or Config(), **STATE["override"])
            call = dataclasses.replace(call, config=config, pinned=None)
        if STATE["split"] is not None:
            config = chosen_config(call) or Config()
            call = dataclasses.replace(call, config=dataclasses.replace(config, split_k=STATE["split"]))
        config = chosen_config(call) or Config()
        ahead = STATE["ahead"]
        if config.load_ahead != bool(ahead):
            call = dataclasses.replace(call, config=dataclasses.replace(config, load_ahead=bool(ahead)))
        if isinstance(ahead, type):  # a load-ahead class of --ahead-kernel: the epilogue's copy for it
            key = (id(call.epi), ahead)
            if key not in EPI_COPIES:
                EPI_COPIES[key] = dataclasses.replace(call.epi, backend_cache={}, checked_calls={})
                with mock.patch.object(_ahead, "AheadEpiMod", functools.partial(_ahead.AheadEpiMod, kernel=ahead)):
                    _quack._epimod(dataclasses.replace(call, epi=EPI_COPIES[key]), True)  # built once, cached
            call = dataclasses.replace(call, epi=EPI_COPIES[key])
        return run(call)
    return go


def human_variant(forward: Callable[..., Any], kwargs: dict[str, Any], dynamic: bool,
                  config: Config | None = None, split: int | None = None,
                  ahead: bool | type = False, override: dict[str, Any] | None = None) -> Callable[[], Any]:
    """``ahead``: every gemm call on the load-ahead kernel (``Config.load_ahead``; a class: that load-ahead class's
    kernel, :data:`EPI_COPIES`), else on QuACK's. ``override``: these Config fields over each gemm call's own."""
    def call() -> Any:
        STATE["dynamic"], STATE["config"], STATE["split"], STATE["ahead"] = dynamic, config, split, ahead
        STATE["override"] = override
        return forward(**kwargs)
    return call


def plain_twin(forward: Callable[..., Any], kwargs: dict[str, Any],
               override: dict[str, Any] | None = None) -> Callable[[], Any]:
    """The kernel's GEMMs with no epilogue: each gemm call of one forward() replayed on the same A and B (their
    layouts too) at the config it ran with, storing the bare accumulator. Beside the kernel it splits the row's gap
    to cuBLAS in two: QuACK's GEMM at this schedule (twin / cuBLAS) and what the epilogue and host ops add (kernel /
    twin)."""
    from coda_agent.primitives import epilogue, gemm

    @epilogue()
    def bare(acc: Any) -> Any:
        return {}

    replays: list[tuple[torch.Tensor, torch.Tensor, Config]] = []

    def run() -> Any:
        STATE["dynamic"], STATE["config"], STATE["split"], STATE["ahead"] = True, None, None, False
        STATE["override"] = None
        if not replays:  # the first call (the probe's build run) records the kernel's calls
            STATE["calls"] = []
            try:
                forward(**kwargs)
            finally:
                calls, STATE["calls"] = STATE["calls"], None
            replays.extend((c.A, c.B, chosen_config(c) or Config()) for c in calls)
        STATE["override"] = override
        return [gemm(bare, a, b, config=config)["D"] for a, b, config in replays]
    return run


def variants_for(task_name: str, dims: dict[str, int], sweep: bool, splits: tuple[int, ...] = (),
                 files: tuple[Path, ...] = (), ahead: bool = False,
                 kernels: tuple[type, ...] = (), ahead_configs: tuple[Config, ...] = (),
                 configs: tuple[Config, ...] = (), overrides: tuple[dict[str, Any], ...] = (),
                 ) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    task = find_task(task_name)
    assert task.human_file is not None, f"{task_name} has no human kernel"
    human = import_file(task.human_file, f"probe_human_{task_name}")
    inputs = task.make_inputs(dims, seed=0, device="cuda")
    kwargs = {**inputs, **task.constants}
    out: dict[str, Callable[[], Any]] = {
        "as written": human_variant(human.forward, kwargs, False),
        "as written, dynamic": human_variant(human.forward, kwargs, True),
        "plain twin, dynamic": plain_twin(human.forward, kwargs),
    }
    if ahead:
        out["as written, dynamic, ahead"] = human_variant(human.forward, kwargs, True, ahead=True)
    for c in configs:  # every gemm call at c, past gemm()'s checks, on QuACK's kernel (and the load-ahead one)
        out[f"as written, dynamic @ {_label(c)}"] = human_variant(human.forward, kwargs, True, c)
        if ahead:
            out[f"as written, dynamic, ahead @ {_label(c)}"] = human_variant(human.forward, kwargs, True, c,
                                                                             ahead=True)
    for fields in overrides:  # each gemm call at its own config with these fields replaced
        name = " ".join(f"{k}={v}" for k, v in fields.items())
        out[f"plain twin, dynamic, {name}"] = plain_twin(human.forward, kwargs, fields)
        out[f"as written, dynamic, {name}"] = human_variant(human.forward, kwargs, True, override=fields)
        if ahead:
            out[f"as written, dynamic, ahead, {name}"] = human_variant(human.forward, kwargs, True, ahead=True,
                                                                       override=fields)
    for kernel in kernels:
        out[f"as written, dynamic, ahead {kernel.__name__}"] = human_variant(human.forward, kwargs, True, ahead=kernel)
        for c in ahead_configs:  # every gemm call at c, past gemm()'s checks (a tile only this class builds)
            out[f"as written, dynamic, ahead {kernel.__name__} @ {_label(c)}"] = human_variant(
                human.forward, kwargs, True, c, ahead=kernel)
    for path in files:  # another forward() of the task, as it writes its configs (and at the sweep's), dynamic
        other = import_file(path, f"probe_variant_{path.stem}")
        out[f"{path.stem}, dynamic"] = human_variant(other.forward, kwargs, True)
        for c in SWEEP if sweep else ():
            out[f"{path.stem} {_label(c)}, dynamic"] = human_variant(other.forward, kwargs, True, c)
    for split in splits:
        out[f"as written, dynamic, split {split}"] = human_variant(human.forward, kwargs, True, None, split)
        for c in SPLIT_TILES:
            out[f"{_label(c)}, dynamic, split {split}"] = human_variant(human.forward, kwargs, True, c, split)
    if sweep:
        for c in SWEEP:
            label = _label(c)
            out[label] = human_variant(human.forward, kwargs, False, c)
            out[label + ", dynamic"] = human_variant(human.forward, kwargs, True, c)
            if ahead:
                out[label + ", dynamic, ahead"] = human_variant(human.forward, kwargs, True, c, ahead=True)
    gemms = cublas_gemms(task, dims)
    if gemms is not None:
        out["cublas"] = gemms
    from quack.gemm_interface import gemm as quack_gemm
    from quack.gemm_interface import gemm_dact
    m, n, k = task.gemm_shapes(dims)[0]
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
    out["quack gemm"] = lambda: quack_gemm(a, b, tuned=False, dynamic_scheduler=False)
    if task_name == "gemm_swiglu_bwd":
        dy, w, pre = inputs["dy"], inputs["w_down"], inputs["preact"]
        out["quack gemm_dact"] = lambda: gemm_dact(dy, w, pre, activation="swiglu", colvec_reduce=True, tuned=False)
        out["quack gemm_dact, static"] = lambda: gemm_dact(dy, w, pre, activation="swiglu", colvec_reduce=True,
                                                           tuned=False, dynamic_scheduler=False)
        for c in SWEEP if sweep else ():  # QuACK's dgated path at the human kernel's tiles, dynamic like the bench's
            out[f"quack gemm_dact {_label(c)}"] = functools.partial(
                gemm_dact, dy, w, pre, activation="swiglu", colvec_reduce=True, tuned=False, dynamic_scheduler=True,
                config=_gemm_config(c, True))
    return out, {"task": task_name, "dims": dims, "M,N,K": [m, n, k]}


def _override(text: str) -> dict[str, Any]:
    """--override's JSON: Config fields by name (checked against a Config here, before any GPU work)."""
    fields = json.loads(text)
    config_from_fields({**dataclasses.asdict(Config()), **fields})
    return dict(fields)


def _label(c: Config) -> str:
    return f"{c.tile_m}x{c.tile_n} {'pp' if c.pingpong else 'coop'} {c.cluster_m}x{c.cluster_n}"


def agreement(variants: dict[str, Callable[[], Any]], reference: str, files: tuple[str, ...] = ()) -> None:
    """Each split variant's outputs against the reference variant's: the largest difference over the largest
    reference value, per output (split-K sums the same products in another order: about bf16's rounding). The
    load-ahead kernels at the kernel's own configs must match QuACK's bit for bit: it says whether each does, and
    whether each --variant file's forward() does (``files``: their names here; some compute other things)."""
    if reference not in variants:
        return
    want = variants[reference]()
    for name, fn in variants.items():
        if name.startswith("as written, dynamic, ahead") or name in files:
            got = fn()
            same = {k: bool(torch.equal(got[k], v)) for k, v in want.items() if isinstance(v, torch.Tensor)}
            print(f"  bitwise equal, {name.removeprefix('as written, dynamic, ')} vs as written: {same}", flush=True)
    for name, fn in variants.items():
        if "split" not in name and " @ " not in name:  # another order of summation: to rounding
            continue
        got = fn()
        worst = {k: float((got[k].float() - v.float()).abs().max() / v.float().abs().max().clamp_min(1e-30))
                 for k, v in want.items() if isinstance(v, torch.Tensor) and v.numel()}
        print(f"  agrees? {name}: " + ", ".join(f"{k} {e:.1e}" for k, e in worst.items()), flush=True)


def runnable(variants: dict[str, Callable[[], Any]]) -> dict[str, Callable[[], Any]]:
    """Run each variant once (builds its kernel); the ones that fail are left out, with the reason printed."""
    kept = {}
    for name, fn in variants.items():
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # a config QuACK refuses for this epilogue, a kernel that does not build
            print(f"  left out {name}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            continue
        kept[name] = fn
    return kept


def rows(specs: list[str]) -> list[tuple[str, str, dict[str, int]]]:
    """``task`` (every bench shape), ``task:shape`` or ``task:M=512,N=4096,K=14336`` (dims of one's own: a shape
    outside the bench, such as a starved grid)."""
    found = []
    for spec in specs:
        name, _, shape = spec.partition(":")
        if "=" in shape:
            found.append((name, shape, {k: int(v) for k, v in (kv.split("=") for kv in shape.split(","))}))
            continue
        task = find_task(name)
        for point in task.shapes["bench"]:
            if not shape or point.name == shape:
                found.append((name, point.name, dict(point.dims)))
    return found


def _load_ahead_class(spec: str) -> type:
    """``FILE:CLASS``: a subclass of the load-ahead kernel defined in FILE."""
    path, _, name = spec.rpartition(":")
    kernel = getattr(import_file(Path(path), f"probe_kernel_{Path(path).stem}"), name)
    if not issubclass(kernel, _ahead.LoadAheadSm90):
        raise argparse.ArgumentTypeError(f"{spec} is not a subclass of LoadAheadSm90")
    return kernel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--row", action="append", default=[], help="task, task:shape or task:DIM=N,... (repeatable)")
    p.add_argument("--sweep", action="append", default=[], help="tasks whose rows also time the config sweep")
    p.add_argument("--json", type=Path, help="append one JSON object per row")
    p.add_argument("--precompile", help="I/N: build (run once) the I-th of N slices of the variants, time nothing")
    p.add_argument("--ncu", action="store_true", help="run each variant once inside the profiler range")
    p.add_argument("--only", action="append", default=[], help="variants to keep (repeatable; default: all)")
    p.add_argument("--variant", action="append", default=[], type=Path,
                   help="a file with the task's forward() written another way, timed beside the human kernel as "
                        "'<file stem>, dynamic' (with --sweep also '<file stem> <config>, dynamic'; repeatable; every "
                        "--row task must take its inputs)")
    p.add_argument("--ahead", action="store_true",
                   help="time the load-ahead kernel too: '<variant>, ahead' beside the kernel as written (and with "
                        "--sweep beside each config), and check it matches QuACK's kernel bit for bit")
    p.add_argument("--ahead-kernel", action="append", default=[], type=_load_ahead_class, metavar="FILE:CLASS",
                   help="a subclass of the load-ahead kernel (e.g. bench/probes/ahead_stages.py:MainloopFirstSm90), "
                        "timed as 'as written, dynamic, ahead CLASS' and checked bit for bit (repeatable)")
    p.add_argument("--config", action="append", default=[], type=lambda s: config_from_fields(json.loads(s)),
                   metavar="JSON", help="the kernel as written with every gemm call at this config, past gemm()'s "
                   "checks: 'as written, dynamic @ 192x128 coop 2x1' (with --ahead also on the load-ahead kernel; "
                   "repeatable; a config QuACK's compiler aborts on ends the probe)")
    p.add_argument("--ahead-config", action="append", default=[], type=lambda s: config_from_fields(json.loads(s)),
                   metavar="JSON", help="each --ahead-kernel also at this config, every gemm call, past gemm()'s "
                   "checks: 'as written, dynamic, ahead CLASS @ 192x192 coop 2x1' (repeatable)")
    p.add_argument("--ahead-packed", action="store_true",
                   help="let packed-mode calls run on the load-ahead kernels at every tile (the product: only at "
                        "tile_n over 128, configs.ahead_mode), so --ahead and --ahead-kernel reach gemm_swiglu_bwd's "
                        "128x128 rows too")
    p.add_argument("--ahead-untiled", action="store_true",
                   help="let calls that read no tile (no C, no tile operand: the LM heads) run on the load-ahead "
                        "kernels too, where the product keeps them on QuACK's (configs.loads_ahead)")
    p.add_argument("--steady", type=float, default=0.0, metavar="SECONDS",
                   help="after each row's timings, run every variant alone for SECONDS with the SM clock and power "
                        "sampled (bench/probes/steady.py): what it costs in cycles, beside what it costs in time")
    p.add_argument("--override", action="append", default=[], type=_override, metavar="JSON",
                   help="the plain twin, the kernel as written (and with --ahead the load-ahead kernel) with these "
                        "Config fields over each gemm call's own config, e.g. '{\"max_swizzle_size\": 16}' (the "
                        "tile scheduler's swizzle group) or '{\"cluster_m\": 1, \"cluster_n\": 1}': 'as written, "
                        "dynamic, ahead, cluster_m=1 cluster_n=1' (repeatable)")
    p.add_argument("--split", action="append", default=[], type=int,
                   help="split-K variants: split_k S (repeatable), with the kernel's config and SPLIT_TILES")
    args = p.parse_args()
    splits, files, kernels = tuple(args.split), tuple(args.variant), tuple(args.ahead_kernel)
    overrides = tuple(args.override)
    configs, forced = tuple(args.ahead_config), tuple(args.config)
    if args.ahead_packed:
        configs_module.AHEAD_MODES = (*configs_module.AHEAD_MODES, "packed")
    if args.ahead_untiled:
        configs_module.loads_ahead = lambda call, config: (  # type: ignore[assignment]
            config.load_ahead and config.split_k == 1 and configs_module.ahead_mode(call.epi.mode, config))
    backend.set_backend("quack", wrap=_forced)
    _quack._gemm_config = lambda config: _gemm_config(config, STATE["dynamic"])  # type: ignore[assignment]
    clock = Clock("cuda")
    sampler = steady.GpuSampler() if args.steady and not (args.precompile or args.ncu) else None
    jobs = rows(args.row)
    if args.precompile:
        i, n = map(int, args.precompile.split("/"))
        first = {t: (s, d) for t, s, d in reversed(jobs)}  # each task's first row: the kernels take any shape
        k = 0
        for t, (s, d) in first.items():
            task = find_task(t)
            if task.input_bytes(d) > PRECOMPILE_ROW_BYTES:
                s, d = "small", dict(task.shapes["small"][0].dims)
            for name, fn in variants_for(t, d, t in args.sweep, splits, files, args.ahead, kernels, configs, forced,
                                         overrides)[0].items():
                if args.only and name not in args.only:
                    continue
                if k % n == i:
                    t0 = time.time()
                    runnable({name: fn})
                    print(f"built {t} {s} {name}: {time.time() - t0:.1f} s", flush=True)
                k += 1
        return
    for task_name, shape, dims in jobs:
        variants, meta = variants_for(task_name, dims, task_name in args.sweep, splits, files, args.ahead, kernels,
                                     configs, forced, overrides)
        variants = runnable({k: v for k, v in variants.items() if not args.only or k in args.only})
        agreement(variants, "as written, dynamic", tuple(f"{p.stem}, dynamic" for p in files))
        if args.ncu:
            for fn in variants.values():
                fn()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            for name, fn in variants.items():
                torch.cuda.nvtx.range_push(name)
                fn()
                torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"ncu {task_name} {shape}: {', '.join(variants)}", flush=True)
            continue
        timings = time_interleaved(variants, clock, RepPlan(warmup=2, target_s=0.1, min_reps=15, max_reps=40))
        base = timings.get("cublas")
        print(f"== {task_name} @ {shape} {meta['M,N,K']}", flush=True)
        for name, timing in sorted(timings.items(), key=lambda kv: kv[1].median_us):
            ratio = f"  {paired_ratio(base, timing):.3f}x cuBLAS" if base else ""
            print(f"  {timing.median_us:9.1f} us  p10 {timing.p10_us:9.1f}  p90 {timing.p90_us:9.1f}  {name}{ratio}",
                  flush=True)
        held: dict[str, dict[str, float]] = {}
        if sampler is not None:
            held = steady.steady(variants, args.steady, torch.cuda.synchronize, sampler)
            print("\n".join(steady.report(held, "plain twin, dynamic" if "plain twin, dynamic" in held else None)),
                  flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps({**meta, "shape": shape, "device": torch.cuda.get_device_name(0),
                                    "timings": {k: v.model_dump() for k, v in timings.items()},
                                    **({"steady": held} if held else {})}) + "\n")
    if sampler is not None:
        sampler.close()


if __name__ == "__main__":
    main()
