"""The GEMM config space the harness searches, how a config is written, and the harness's own override.

Not part of the candidate surface (``coda_agent.primitives.__all__``), like :mod:`.backend`. One home for:

* :data:`TILES` x :data:`CLUSTERS`: the large-tile part of QuACK's SM90 space where the bench shapes'
  winners live (swap_ab is left out: :class:`Config` cannot express it), plus :data:`STARVED_SPLITS` for a
  grid of fewer tiles than SMs, used by the offline tuner of the human kernels and by the verifier's ``tune``
  stage;
* ``Config(...)`` source text and short labels;
* a schedule on the wire (JSON) between the checker and the sandboxed runner;
* the config a gemm call runs with (:func:`chosen_config`, :func:`kernel_config`): the one home of the
  precedence (the harness's schedule > the call's ``config=`` > :func:`default_config`) and of the load-ahead
  decision;
* :class:`ScheduleOverride`: the harness's schedule, applied to every gemm call over whatever the candidate
  pinned or passed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import torch

from ._call import GemmCall, Runner
from ._config import Config, EpilogueError, Major, Mode
from ._ops import RowVecReduce
from ._schedule import ScheduleKey
from .quack_patches import H200_SM_COUNT

#: (tile_m, tile_n, pingpong) candidates; each runs with every cluster of :data:`CLUSTERS`. The pingpong tiles
#: are QuACK's own SM90 pingpong space (``quack.gemm_config``): 192x128 is the tile the two rope kernels run
#: (it beat the 128x192 default by 4% at the ragged 8000 x 5000 in the bench at 006be5d, where gemm_rmsnorm,
#: on the default, fell short), and 128x160 cuts N = 4000 into whole tiles. The last two are cuBLAS's own
#: cooperative tiles at the bench shapes (192x192 at the wide GEMMs, 320x128 at 16384 x 4096 and the Llama-3
#: LM heads: bench/results/h200-2026-12-02-g-cublas.log). Timed by the tune stage
#: (h200-2026-12-02-h-tune-human.json): 192x192 won gemm_residual's ragged row by 1.4%, 320x128 ran 25-37%
#: slower wherever it ran.
TILES = ((128, 128, True), (128, 160, True), (128, 192, True), (128, 208, True), (192, 128, True),
         (128, 256, False), (256, 128, False), (256, 160, False), (256, 192, False), (192, 192, False),
         (320, 128, False))
#: (cluster_m, cluster_n): both 2-CTA clusters.
CLUSTERS = ((2, 1), (1, 2))

#: What the tune stage adds for a starved grid (fewer output tiles than SMs at the default tile): split-K at
#: the two tiles the probe compared. QuACK's serial split-K measured on the H200
#: (bench/results/h200-2026-12-02-e-split-probe.log, in-process, at the GPU's power cap) 1.18x as written at M
#: 512 x N 4096 x K 14336 and 1.085x at 1024 x 2048 x 8192 (128x128, split 2), but lost up to 5x at full grids
#: (the turnstile serialises the partials): searched, never assumed.
STARVED_SPLITS = tuple(Config(tile_n=n, split_k=s) for n in (128, 192) for s in (2, 3, 4))
#: The least K a split keeps (shorter ones are mostly pipeline fill).
MIN_SPLIT_DEPTH = 1024

#: The tile scheduler's swizzle groups (``max_swizzle_size``: tiles walked along the fast dimension before
#: the next row or column of them; QuACK's default 8 first), tried at each call's fastest config once its
#: tiles are searched. A runtime argument of the kernel: no build. On the H100
#: (bench/results/h100-2026-12-06-b-notes.md) 16, which covers every column tile of a narrow N, took 3.0% off
#: the load-ahead kernel at gemm_rmsnorm_bwd's K-3072 dgrad row and 1.3% at gemm_residual_rmsnorm
#: llama3-1b-down; at gemm_swiglu_bwd's 64 column tiles 16 cost 14% and 4 gained 1-2%.
SWIZZLE_GROUPS = (8, 16, 4)

Schedule = Mapping[ScheduleKey, Config]


def config_space(mode: Mode, has_outputs: bool, mnk: tuple[int, int, int] | None = None, store_d: bool = True,
                 sms: int = H200_SM_COUNT, b_major: Major = "k", reads_tiles: bool = False) -> list[Config]:
    """Every config of :data:`TILES` x :data:`CLUSTERS` that QuACK accepts for this epilogue, the default
    first; for a call of ``mnk`` whose default tiles fill less than one wave of ``sms``, also the
    :data:`STARVED_SPLITS` that keep :data:`MIN_SPLIT_DEPTH` of K each. Where the load-ahead kernel would run
    (an epilogue that ``reads_tiles``, :func:`loads_ahead`), each tile also on QuACK's kernel
    (``load_ahead=False``), right after it. For a call of ``mnk`` the rest come in the order of their
    :func:`wave_cost` (ties in the order of :data:`TILES`): a search its budget cuts short has tried the tiles
    that waste the least of the grid first (at the ragged 8000 x 4000, cuBLAS's 192x192, which won there)."""
    candidates = [c for tile_m, tile_n, pingpong in TILES for cluster_m, cluster_n in CLUSTERS
                  for c in _kernels(Config(tile_m=tile_m, tile_n=tile_n, cluster_m=cluster_m,
                                           cluster_n=cluster_n, pingpong=pingpong), mode, reads_tiles)]
    if mnk is not None and tile_count(mnk[0], mnk[1], Config()) < sms:
        candidates += [c for c in STARVED_SPLITS if mnk[2] // c.split_k >= MIN_SPLIT_DEPTH]
    space = []
    for config in candidates:
        try:
            config.check(mode, has_outputs, store_d, b_major)
        except EpilogueError:
            continue
        space.append(config)
    if mnk is None:
        return sorted(space, key=lambda c: not _default_tile(c))
    return sorted(space, key=lambda c: (not _default_tile(c), wave_cost(mnk[0], mnk[1], c, sms)))


def swizzled(config: Config) -> list[Config]:
    """``config`` at each other swizzle group of :data:`SWIZZLE_GROUPS`."""
    return [dataclasses.replace(config, max_swizzle_size=g) for g in SWIZZLE_GROUPS
            if g != config.max_swizzle_size]


def _default_tile(c: Config) -> bool:
    """The arch default, on either kernel (a sort keeps the two side by side)."""
    return dataclasses.replace(c, load_ahead=True) == Config()


def _kernels(config: Config, mode: Mode, reads_tiles: bool) -> tuple[Config, ...]:
    """``config``, and the same tile on QuACK's kernel where the load-ahead kernel would run it."""
    both = reads_tiles and ahead_mode(mode, config)
    return (config, dataclasses.replace(config, load_ahead=False)) if both else (config,)


#: The modes the load-ahead kernel runs in at every tile.
AHEAD_MODES = ("element", "acc_pair")


def ahead_mode(mode: Mode, config: Config) -> bool:
    """Whether the load-ahead kernel runs ``mode`` at ``config``'s tile: :data:`AHEAD_MODES` at any, packed
    mode at pingpong tiles wider than 128. There its epilogue (one barrier per subtile, buffers per pingpong
    group) ran gemm_swiglu_bwd's three K-4096 rows at 128x192 9.8-10.0% faster than QuACK's kernel (H100,
    bench/results/h100-2026-12-05-d-lean-probe.log); at the 128x128 packed default it ran from 2% faster to
    4.5% slower (2-3% slower before that epilogue, H200, bench/results/h200-2026-12-04-a-notes.md), and no
    cooperative packed tile has run on it."""
    return mode in AHEAD_MODES or (mode == "packed" and config.pingpong and config.tile_n > 128)


def loads_ahead(call: GemmCall, config: Config) -> bool:
    """Whether the call runs on the load-ahead kernel (``primitives/_ahead.py``) under ``config``: asked for
    (``load_ahead``), something to load (C or a tile operand), a mode and tile :func:`ahead_mode` takes, and K
    unsplit (a split call's protocol lives in QuACK's kernel). Measured on the H200 (2026-12-04-a): 0.3-1.7%
    faster than QuACK's kernel at gemm_residual's bench rows, the same at gemm_residual_rmsnorm's, bit for bit
    the same outputs."""
    return (config.load_ahead and config.split_k == 1 and ahead_mode(call.epi.mode, config)
            and call.reads_tiles and not call.stats)  # its epilogue has no accumulator prepass


#: QuACK's dynamic persistent tile scheduler (an atomic tile counter instead of a fixed tile order): on.
#: Measured on the H200 (bench/probes, 2026-12-01) with the human kernels' configs at 15 bench rows of three
#: tasks it was faster at 14 (0.2-3.7%; up to 1.09x in a bench). On SM90 QuACK's eager call zero-fills a fresh
#: counter before every call, one more kernel launch per gemm call; the QuACK backend reuses one
#: self-resetting counter per stream instead (``_quack._tile_counter``).
DYNAMIC_SCHEDULER = True
#: The tile every packed-mode call that names no config runs: the C and D tiles are twice as wide as the
#: GEMM's, and at QuACK's 128x192 default the epilogue, not the mainloop, sets the time (ncu at
#: gemm_swiglu_bwd coda-h2048: 51% SM and 30% DRAM throughput against 94% SM for the plain GEMM). 128x128
#: pingpong measured 1.11-1.53x faster than 128x192 at all five gemm_swiglu_bwd bench shapes, and faster than
#: every other tile of the sweep (bench/README.md, Kernel configs). Its 2x1 cluster too: 1x2 took 8-12% longer
#: for the forward's packed kernels at K 2048, though the SwiGLU backward's pins take it there
#: (bench/results/h100-2026-12-06-d-notes.md).
PACKED_TILE = Config(tile_n=128)
#: The tile an element-mode call that names no config runs where the wave model says the 128x192 default
#: wastes part of a wave by :data:`NARROW_MIN_GAIN` or more (the narrow-N projections).
NARROW_TILE = Config(tile_n=128)
#: The predicted gain below which the arch default stays. Measured (static scheduler) against 128x192: at M
#: 8192 x N 2048 (model 1.125) 128x128 was 1.07-1.10x faster in two epilogues; at 1.031 (N 4096, and the
#: ragged 8000 x 4000) it ranged from 1.06x faster to 1.2x slower (the ragged shape). A 3% bar (with a padding
#: model besides) moved the N 4096 rows to 128x128 and lost them 2-3.5% against cuBLAS in the bench
#: (bench/README.md, Kernel configs).
NARROW_MIN_GAIN = 1.05
#: The tile an element-mode call with a light epilogue (:func:`light_epilogue`) that names no config runs
#: where K is at least :data:`LONG_K_MIN` and the wave model does not favour the arch default: cooperative
#: 128x256, cuBLAS's kind of schedule at these shapes (its kernels there are cooperative, 256x128 and 160x192,
#: bench/results/h200-2026-12-02-g-cublas.log). The verifier's tune stage on the H200
#: (h200-2026-12-02-g-tune-human.json, GPU time) ranked it first or within 0.5% of first at all five long-K
#: rows of gemm_residual and gemm_residual_rmsnorm (1.8-4.3% faster than the configs as written), and the
#: bench then moved those rows 2.4-4.5% closer to cuBLAS; below that K it lost 2-4% (K 4096-5632, where the
#: epilogue, which in a cooperative tile no other warp group's mainloop hides, is a larger share of each
#: tile); at gemm_rmsnorm_bwd (a tile operand and a reduce down the columns) it ran 1.5x slower at every shape
#: the search reached it.
LONG_K_TILE = Config(tile_n=256, pingpong=False)
LONG_K_MIN = 8192


def tile_count(m: int, n: int, config: Config) -> int:
    """Output tiles of an (m, n) GEMM, partial ones included."""
    return -(-m // config.tile_m) * -(-n // config.tile_n)


def wave_cost(m: int, n: int, config: Config, sms: int = H200_SM_COUNT) -> float:
    """Output elements one SM computes over the whole K, padding and the last partial wave included (a split's
    work units each cover 1/split_k of K): a persistent kernel's time at a fixed tile efficiency (tiles of the
    same kind only)."""
    units = tile_count(m, n, config) * config.split_k
    return -(-units // sms) * config.tile_m * config.tile_n / config.split_k


def default_config(call: GemmCall, sms: int | None = None) -> Config | None:
    """What a gemm call that names no config runs with: QuACK's SM90 default (None: 128x192 pingpong 2x1),
    :data:`PACKED_TILE` in packed mode, or in element mode :func:`narrow_n_tile` where N is narrower than the
    default's tile, and where the default fills at least one wave
    :data:`LONG_K_TILE` for a light epilogue at a long K, else :data:`NARROW_TILE` where the wave model gains
    :data:`NARROW_MIN_GAIN` (at M 8192, N 2048: 11 column tiles of 192 make 5.3 waves on 132 SMs, 16 of 128
    make 7.8). ``sms``: the device's count (default: the visible GPU's, else the H200's: the CPU compile
    builds what an H200 would run). Asked on every gemm call (the backend, the runner's op log), so the rule
    is memoised."""
    if call.epi.mode == "packed":
        return PACKED_TILE
    if call.epi.mode != "element":
        return whole_heads(None, call.tile_n_multiple)
    if sms is None:
        sms = _sm_count(call.A.device) if call.A.is_cuda else H200_SM_COUNT
    long_light = int(call.A.shape[1]) >= LONG_K_MIN and light_epilogue(call)
    return whole_heads(_element_default(call.m, call.n, long_light, sms), call.tile_n_multiple)


def whole_heads(config: Config | None, multiple: int) -> Config | None:
    """``config``, or where its tile would split a :class:`HeadRstd`'s head (its N not a ``multiple``), a
    tile of whole heads: 128 rows by as many heads as fit in 208 columns (pingpong, 2x1), or one head of more
    than 208 columns on a cooperative 128-row tile."""
    if (config or Config()).tile_n % multiple == 0:
        return config
    if multiple <= 208:
        return Config(tile_n=208 // multiple * multiple)
    return Config(tile_n=multiple, pingpong=False)


def light_epilogue(call: GemmCall) -> bool:
    """No tile operand besides C and no reduce down the columns (:class:`RowVecReduce`): the kind of epilogue
    that measured faster cooperative at long K (see :data:`LONG_K_TILE`)."""
    return (all(op.kind != "tile" for op in call.operands.values())
            and not any(isinstance(s, RowVecReduce) for s in call.epi.sinks.values()))


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def narrow_n_tile(n: int) -> Config:
    """The tile of an element-mode call narrower than the default's 192 columns: 64 rows, N rounded up to 16
    columns. Measured on an H100 (bench/results/h100-2026-12-07-a-notes.md, an OnlineLSEReduce epilogue): at
    M 16384, K 4096, N 64 49.9 us against 65.2 at 128x192 (cuBLAS 49.7), N 128 52.1 against 56.1; at M 8192,
    N 160, K 2048 14.1 against 21.4 (128xN: 51.0, 53.6, 19.0): half-height tiles give twice the CTAs where one
    row of 128-row tiles leaves SMs idle. On QuACK's kernel: the load-ahead kernel runs a 64-row tile
    correctly (tests/test_gpu_primitives.py, H100, bench/results/h100-2026-12-07-b-guards.log) but has not
    been timed there."""
    return Config(tile_m=64, tile_n=-(-n // 16) * 16, load_ahead=False)


@functools.cache
def _element_default(m: int, n: int, long_light: bool, sms: int) -> Config | None:
    """``long_light``: K reaches :data:`LONG_K_MIN` and the epilogue is light."""
    if n < Config().tile_n:  # a narrow output (a router's 64 experts): no MMA on columns past N
        return narrow_n_tile(n)
    if tile_count(m, n, Config()) < sms:  # less than one wave: not what the rules were measured on
        return None
    if long_light and wave_cost(m, n, LONG_K_TILE, sms) <= wave_cost(m, n, Config(), sms):
        return LONG_K_TILE
    gain = wave_cost(m, n, Config(), sms) / wave_cost(m, n, NARROW_TILE, sms)
    return NARROW_TILE if gain >= NARROW_MIN_GAIN else None


def chosen_config(call: GemmCall) -> Config | None:
    """The config a gemm call runs with, by precedence: the schedule in force pins it (``call.pinned``: the
    harness's :class:`ScheduleOverride`, else ``forward``'s ``@schedule``), else the call's own ``config=``,
    else :func:`default_config`; None: QuACK's arch default, ``Config()``. The runner's op log records it."""
    return call.pinned or call.config or default_config(call)


def kernel_config(call: GemmCall) -> Config:
    """:func:`chosen_config`, with ``load_ahead`` saying which kernel runs (:func:`loads_ahead`): what the
    QuACK backend builds and launches."""
    config = chosen_config(call) or Config()
    return _with_ahead(config, loads_ahead(call, config))


@functools.cache
def _with_ahead(config: Config, ahead: bool) -> Config:
    """``config`` with ``load_ahead`` set to ``ahead`` (memoised: it is asked on every launch)."""
    return config if config.load_ahead == ahead else dataclasses.replace(config, load_ahead=ahead)


def config_literal(c: Config) -> str:
    """``Config(...)`` source for a config, naming only the fields that differ from the default."""
    default = Config()
    fields = [f"{f.name}={getattr(c, f.name)!r}" for f in dataclasses.fields(c) if getattr(c, f.name)
              != getattr(default, f.name)]
    return f"Config({', '.join(fields)})"


def config_label(c: Config | None) -> str:
    """``128x208 pingpong 2x1`` (``... split-k 2`` when K is split, ``... no-ahead`` with ``load_ahead`` off,
    ``... swizzle 16`` with a swizzle group other than QuACK's 8); ``default`` for None (QuACK's arch
    default)."""
    if c is None:
        return "default"
    kind = "pingpong" if c.pingpong else "coop"
    split = f" split-k {c.split_k}" if c.split_k > 1 else ""
    ahead = "" if c.load_ahead else " no-ahead"
    swizzle = f" swizzle {c.max_swizzle_size}" if c.max_swizzle_size != SWIZZLE_GROUPS[0] else ""
    return f"{c.tile_m}x{c.tile_n} {kind} {c.cluster_m}x{c.cluster_n}{split}{ahead}{swizzle}"


def config_fields(c: Config) -> dict[str, int | bool]:
    """The fields by name (a shallow copy: every field is a number or a flag; the op log asks once per gemm
    call)."""
    return {f.name: getattr(c, f.name) for f in _CONFIG_FIELDS}


_CONFIG_FIELDS = dataclasses.fields(Config)


def config_from_fields(fields: object) -> Config:
    """A Config from its fields as JSON carries them; ValueError for anything else (unknown or mistyped
    fields)."""
    if not isinstance(fields, dict):
        raise ValueError(f"a config must be an object of fields, got {type(fields).__name__}")
    types = {f.name: f.type for f in dataclasses.fields(Config)}
    for name, value in fields.items():
        if name not in types:
            raise ValueError(f"unknown config field {name!r}")
        want_bool = types[name] in (bool, "bool")
        if isinstance(value, bool) != want_bool or not isinstance(value, int):
            raise ValueError(f"config field {name!r} must be {'a bool' if want_bool else 'an integer'}, got "
                             f"{value!r}")
    return Config(**fields)


def schedule_to_wire(table: Schedule) -> list[list[Any]]:
    """``[[epilogue, M, N, K, {config fields}], ...]``, sorted."""
    return [[*key, config_fields(c)] for key, c in sorted(table.items())]


def schedule_from_wire(entries: object) -> dict[ScheduleKey, Config]:
    """The inverse of :func:`schedule_to_wire`; ValueError for a malformed entry."""
    if not isinstance(entries, list):
        raise ValueError("a schedule must be a list of [epilogue, M, N, K, config] entries")
    table: dict[ScheduleKey, Config] = {}
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 5 and isinstance(entry[0], str)
                and all(isinstance(d, int) and not isinstance(d, bool) for d in entry[1:4])):
            raise ValueError(f"malformed schedule entry {entry!r}")
        table[(entry[0], entry[1], entry[2], entry[3])] = config_from_fields(entry[4])
    return table


class ScheduleOverride:
    """The harness's schedule over a backend: a gemm call it names runs with its config, checked as ``gemm``
    checks."""

    def __init__(self) -> None:
        self.table: dict[ScheduleKey, Config] = {}

    def wrap(self, run: Runner) -> Runner:
        def overridden(call: GemmCall) -> dict[str, torch.Tensor]:
            config = self.table.get(call.key)
            if config is None:
                return run(call)
            call.check_config(config)
            return run(dataclasses.replace(call, pinned=config))

        return overridden
