"""The load-ahead kernel on a CPU: which calls it runs, what the tuner searches, its stage split, its
compile-cache identity, and every suite kernel built on it for sm_90a (its outputs on the GPU:
tests/test_gpu_ahead.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from coda_agent import primitives as P
from coda_agent.primitives import backend
from coda_agent.primitives.configs import config_label, config_space, kernel_config, loads_ahead
from coda_agent.tasks import load_tasks

from .conftest import REPO, TASK_DIR, runner_folder


@P.epilogue()
def add_c(acc, c):
    return {"D": acc + c}


@P.epilogue()
def add_tile(acc, bias_tile):
    return {"D": acc + bias_tile}


@P.epilogue()
def plain(acc):
    return {}


@P.epilogue(outputs=("act",), mode="packed")
def packed_bwd(acc, c):
    gate, up = P.unpack(c)
    dgate, dup, act = P.dswiglu(gate, up, acc)
    return {"D": P.pack(dgate, dup), "act": act}


def _call(epi, config=None, **operands):
    """The GemmCall one gemm() makes (on the emulator), with ``config``."""
    from coda_agent.primitives import _emulator

    seen = []

    def record(call):
        seen.append(call)
        return _emulator.run(call)

    a, w = torch.zeros(64, 32).bfloat16(), torch.zeros(128, 32).bfloat16()
    with backend.using("torch", run=record):
        P.gemm(epi, a, w.t(), config=config, **operands)
    return seen[0]


def test_the_load_ahead_kernel_runs_where_the_epilogue_reads_a_tile_and_nowhere_else():
    c = torch.zeros(64, 128).bfloat16()
    on = P.Config()
    assert loads_ahead(_call(add_c, C=c), on)
    assert loads_ahead(_call(add_tile, bias_tile=c), on)  # a tile operand, not C
    assert not loads_ahead(_call(plain), on)  # nothing to load
    assert not loads_ahead(_call(add_c, C=c), P.Config(load_ahead=False))  # asked not to
    assert not loads_ahead(_call(add_c, C=c, config=P.Config(split_k=2)), P.Config(split_k=2))
    packed = _call(packed_bwd, C=torch.zeros(64, 256).bfloat16())
    assert not loads_ahead(packed, P.Config(tile_n=128)) and not kernel_config(packed).load_ahead  # the
    # packed default, 128x128: measured slower; wider, 10% faster (h100-2026-12-05-d-lean-probe.log)
    assert loads_ahead(packed, P.Config(tile_n=192))
    assert not loads_ahead(packed, P.Config(tile_m=256, tile_n=192, pingpong=False))  # never run there
    # The backend's choice follows the rule, whatever the config asked.
    assert kernel_config(_call(add_c, config=on, C=c)).load_ahead
    assert not kernel_config(_call(plain, config=on)).load_ahead
    # a call narrower than the default tile (N 128 here) defaults to 64 x N on QuACK's kernel
    assert not kernel_config(_call(add_c, C=c)).load_ahead


def test_the_tuner_tries_each_tile_on_both_kernels_only_where_the_load_ahead_kernel_would_run():
    mnk = (8192, 2048, 8192)
    both = config_space("element", False, mnk, reads_tiles=True)
    one = config_space("element", False, mnk, reads_tiles=False)
    assert all(c.load_ahead for c in one)
    assert len(both) == 2 * len(one)
    # each tile, then the same on QuACK's kernel
    for ahead, quacks in zip(both[::2], both[1::2], strict=True):
        assert ahead.load_ahead and quacks == dataclasses.replace(ahead, load_ahead=False)
    packed = config_space("packed", True, mnk, reads_tiles=True)
    on_quacks = {c for c in packed if not c.load_ahead}
    wide = [c for c in packed if c.load_ahead and c.tile_n > 128 and c.pingpong]
    assert wide and on_quacks == {dataclasses.replace(c, load_ahead=False) for c in wide}
    assert config_label(P.Config(load_ahead=False)).endswith("no-ahead")


#: What the stage test computes, in a child process of its own (as every test here that runs the CuTe DSL's
#: compiler: its libraries stay out of the test worker, which later runs torch's CPU kernels).
_STAGES = """
import json, sys
from cutlass import BFloat16
from cutlass._mlir import ir
from quack.gemm_sm90 import GemmSm90
from coda_agent.primitives._ahead import LoadAheadSm90
out = []
with ir.Context(), ir.Location.unknown():  # the DSL's layout algebra, outside a kernel
    for tile, subtile in json.loads(sys.argv[1]):
        args = (tuple(tile), tuple(subtile), BFloat16, BFloat16, BFloat16, BFloat16, None, 232448, 1)
        out.append([LoadAheadSm90.c_deepened_stages(*args), GemmSm90._compute_stages(*args)])
print(json.dumps(out))
"""
TILES = [((128, 256, 64), (128, 32)), ((192, 192, 64), (64, 32)), ((128, 192, 64), (64, 32)),
         ((128, 208, 64), (64, 16)), ((128, 128, 64), (64, 32))]


def _child(script: str, *args: str) -> str:
    """Run ``script`` in a fresh interpreter (the repository first on its path); its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_the_c_stages_grow_only_into_smem_quack_gave_to_d_stages():
    for (tile, subtile), (ahead, quacks) in zip(TILES, json.loads(_child(_STAGES, json.dumps(TILES))),
                                                strict=True):
        (ab, d, c), (ab_q, d_q, c_q) = ahead, quacks
        subtiles = tile[0] * tile[1] // (subtile[0] * subtile[1])
        assert ab == ab_q and c_q <= c <= subtiles and d >= min(2, subtiles), (tile, ahead, quacks)
        assert c + d <= c_q + d_q  # the same bytes per stage: never more smem than QuACK's split


def test_the_two_kernels_of_one_epilogue_never_share_a_compile_cache_entry():
    from quack.epilogue import EpiMod

    from coda_agent.primitives._ahead import AheadEpiMod, LoadAheadSm90

    def fn(acc, c):
        return acc + c

    class Deeper(LoadAheadSm90):  # a probe's stage split: a kernel of its own
        epi_c_stage_base = 6

    digests = {EpiMod(fn).semantic_digest, AheadEpiMod(fn).semantic_digest,
               AheadEpiMod(fn, kernel=Deeper).semantic_digest}
    assert len(digests) == 3
    assert AheadEpiMod(fn, kernel=Deeper).semantic_digest == AheadEpiMod(fn, kernel=Deeper).semantic_digest


_PROBE_STAGES = """
from cutlass import BFloat16
from cutlass._mlir import ir
from quack.gemm_sm90 import GemmSm90
from coda_agent.tasks.loader import import_file
kernel = import_file(__import__("pathlib").Path(__import__("sys").argv[1]), "stages").MainloopFirstSm90
with ir.Context(), ir.Location.unknown():
    c = ((128, 256, 64), (128, 32), BFloat16, BFloat16, BFloat16)
    print(__import__("json").dumps([kernel.c_deepened_stages(*c, BFloat16, None, 232448, 1),
                                    GemmSm90._compute_stages(*c, None, None, 232448, 1)]))
"""


def test_the_probes_mainloop_first_split_keeps_the_plain_gemms_ab_stages_at_128x256():
    """bench/probes/ahead_stages.py's premise (issue 44): with C reading, QuACK's split drops to 3 A/B stages
    at 128x256, the plain GEMM's has 4; the probe's kernel keeps 4 and still has C and D stages."""
    (ab, d, c), (ab_plain, _,
                 _) = json.loads(_child(_PROBE_STAGES, str(REPO / "bench/probes/ahead_stages.py")))
    assert ab == ab_plain == 4 and c >= 2 and d >= 2


#: The next probe's two splits at gemm_rmsnorm_bwd's 128x192 pingpong tile, its epilogue's shared memory as
#: the sm_90a build counts it (C and h: 4 KiB a subtile each; D and normed: the same; 1 KiB of vectors).
_NEXT_SPLITS = """
import json, sys
from cutlass import BFloat16
from cutlass._mlir import ir
from coda_agent.primitives._ahead import LoadAheadSm90
from coda_agent.tasks.loader import import_file
probe = import_file(__import__("pathlib").Path(sys.argv[1]), "stages")
class Bytes:
    unstaged, d_stage, c_stage = 1024, 4096, 4096
out = {}
with ir.Context(), ir.Location.unknown():
    for kernel in (LoadAheadSm90, probe.DeepCSm90, probe.DeepStoresSm90):
        split = type("Split", (kernel,), {"epi_smem_bytes": classmethod(lambda cls, *a: Bytes())})
        instance = object.__new__(split)
        instance.pingpong = True
        args = ((128, 192, 64), (64, 32), BFloat16, BFloat16, BFloat16, BFloat16, None, 232448, 1)
        out[kernel.__name__] = instance._compute_stages(*args)
print(json.dumps(out))
"""


def test_the_next_probes_splits_trade_one_ab_stage_for_c_depth_or_stores_in_flight():
    """bench/notes/2026-12-05-epilogue-probes.md, last section: the product's split at gemm_rmsnorm_bwd's tile
    (4 A/B, 2 + 2 D, 3 C) leaves each group two store buffers, so no store stays in flight; the probes give an
    A/B stage to C (8 deep) or to stores (4 a group), in the same shared memory."""
    out = json.loads(_child(_NEXT_SPLITS, str(REPO / "bench/probes/ahead_stages.py")))
    assert out["LoadAheadSm90"] == [4, 4, 3]
    assert out["DeepCSm90"] == [3, 4, 8]
    assert out["DeepStoresSm90"] == [3, 8, 4]
    ab_kib, subtile_kib = 40, 8  # (128 + 192) x 64 bf16; two 64x32 bf16 tensors
    used = {name: ab * ab_kib + (d + c) * subtile_kib for name, (ab, d, c) in out.items()}
    assert used["DeepCSm90"] == used["DeepStoresSm90"] == used["LoadAheadSm90"] == 216


#: The long-K probe's split beside the product's, at gemm_rmsnorm_bwd's cooperative tiles, with the
#: epilogue's shared memory as the sm_90a build counts it at each subtile (C and h, D and normed; the vectors
#: and dgamma's partial sums unstaged).
_LONG_K_SPLITS = """
import json, sys
from cutlass import BFloat16
from cutlass._mlir import ir
from coda_agent.primitives._ahead import LoadAheadSm90
from coda_agent.tasks.loader import import_file
probe = import_file(__import__("pathlib").Path(sys.argv[1]), "stages")
def split(kernel, tile, subtile, unstaged, pingpong=False):
    share = subtile[0] * subtile[1] * 2  # one more bf16 tensor a stage: h beside C, normed beside D
    class Bytes:
        pass
    Bytes.unstaged, Bytes.d_stage, Bytes.c_stage = unstaged, share, share
    cls = type("Split", (kernel,), {"epi_smem_bytes": classmethod(lambda cls, *a: Bytes())})
    instance = object.__new__(cls)
    instance.pingpong = pingpong
    return instance._compute_stages(tile, subtile, BFloat16, BFloat16, BFloat16, BFloat16, None, 232448, 1)
with ir.Context(), ir.Location.unknown():
    print(json.dumps({
        "product 256x128": split(LoadAheadSm90, (256, 128, 64), (128, 32), 5888),
        "long K 256x128": split(probe.LongKSm90, (256, 128, 64), (128, 16), 5888),
        "long K 128x256": split(probe.LongKSm90, (128, 256, 64), (128, 8), 8704),
        "long K 128x256 at 128x16": split(probe.LongKSm90, (128, 256, 64), (128, 16), 8704),
        "long K pingpong": split(probe.LongKSm90, (128, 192, 64), (64, 32), 1024, pingpong=True),
    }))
"""


def test_the_long_k_probe_gives_a_cooperative_mainloop_four_stages_beside_the_epilogues_floor():
    """bench/probes/ahead_stages.py's LongKSm90 (issue 45's LM-head dgrad, issue 44): where gemm_rmsnorm_bwd's
    epilogue leaves a cooperative tile's mainloop 2 A/B stages, the probe keeps 4 and the epilogue at 2 D and
    at least 1 C stage, on narrower subtiles; where the floor does not fit (128x256 at 128x16, by 512 bytes),
    the product's split stands; pingpong tiles already have 4."""
    out = json.loads(_child(_LONG_K_SPLITS, str(REPO / "bench/probes/ahead_stages.py")))
    assert out["product 256x128"] == [2, 2, 5]
    assert out["long K 256x128"] == [4, 2, 1]
    assert out["long K 128x256"] == [4, 2, 3]
    assert out["long K 128x256 at 128x16"][0] < 4
    assert out["long K pingpong"] == [4, 4, 3]


@pytest.mark.slow
@pytest.mark.parametrize("tile", ['"tile_m": 256, "tile_n": 128', '"tile_m": 128, "tile_n": 256'])
def test_the_long_k_probe_builds_gemm_rmsnorm_bwd_at_cooperative_tiles_for_sm90(monkeypatch, tmp_path, tile):
    """The probe's kernels for the next device call (bench/probes/args/long_k_coop.txt): gemm_rmsnorm_bwd on
    LongKSm90 at 256x128 and 128x256 cooperative, built for sm_90a."""
    monkeypatch.setenv("QUACK_CACHE_DIR", str(tmp_path))
    _child(_BUILD_AT, "gemm_rmsnorm_bwd", f'{{{tile}, "pingpong": false, "load_ahead": true}}', "LongKSm90")
    assert any(tmp_path.rglob("*.o"))


_THREE_GROUPS = """
import json, sys
from pathlib import Path
from cutlass import BFloat16, Float32
from quack.gemm_sm90 import GemmSm90
from coda_agent.primitives._ahead import LoadAheadSm90
from coda_agent.tasks.loader import import_file
three = import_file(Path(sys.argv[1]), "three").ThreeWarpGroupsSm90
keys = ("atom_layout_mnk", "mma_warp_groups", "threads_per_cta", "num_epi_warps", "ab_load_warp_id",
        "num_regs_load", "num_regs_mma", "cta_tile_shape_mnk")
def made(cls, tile, pingpong):
    gemm = cls(Float32, BFloat16, tile, (1, 1, 1), pingpong=pingpong)
    return {k: list(v) if isinstance(v, tuple) else v for k in keys for v in [getattr(gemm, k)]}
tiles = [((192, 192), False), ((192, 160), False), ((192, 128), False), ((192, 256), False),
         ((128, 192), True)]
print(json.dumps([[made(cls, t, pp) for cls in (three, GemmSm90, LoadAheadSm90)] for t, pp in tiles]))
"""


def test_the_probes_three_warp_groups_lay_a_192_row_tile_as_quack_lays_192x128():
    """bench/probes/three_warp_groups.py (issues 44, 45): a cooperative 192x160 or 192x192 tile gets QuACK's
    own three-group layout of its 192x128 tile (warps, register budgets, epilogue threads) with N kept; every
    other tile is the load-ahead kernel's as it is."""
    (t192, q192, _), (t160, _, _), (t128, q128, a128), (t256, _, a256), (pp, _, app) = json.loads(
        _child(_THREE_GROUPS, str(REPO / "bench/probes/three_warp_groups.py")))
    assert q192["atom_layout_mnk"] == [1, 2, 1]  # QuACK's: side by side along N
    for tile, n in ((t192, 192), (t160, 160)):
        assert {**tile, "cta_tile_shape_mnk": None} == {**q128, "cta_tile_shape_mnk": None}
        assert tile["cta_tile_shape_mnk"] == [192, n, 0]
    assert (t128, t256, pp) == (a128, a256, app)


_REGISTERS = """
import json
from cutlass import BFloat16, Float32
from coda_agent.primitives._ahead import LoadAheadSm90
tiles = [((128, 192), True), ((128, 128), True), ((256, 128), False), ((256, 192), False),
         ((256, 256), False)]
print(json.dumps([[(g := LoadAheadSm90(Float32, BFloat16, t, (1, 1, 1), pingpong=pp)).num_regs_load,
                   g.num_regs_mma] for t, pp in tiles]))
"""


def test_the_load_ahead_kernel_takes_the_wide_register_split_from_192_accumulators_a_thread():
    """24/240 where a math thread holds 192 accumulators or more (128x192 pingpong, 256x192 cooperative; QuACK
    takes it from 208: 256x256 cooperative); QuACK's 40/232 at 128 (128x128 pingpong, 256x128 cooperative),
    where the wide split measured slower (bench/results/h100-2026-12-06-a-notes.md)."""
    assert json.loads(_child(_REGISTERS)) == [[24, 240], [40, 232], [40, 232], [24, 240], [24, 240]]


TASKS = load_tasks([TASK_DIR])


#: Every gemm call of a human kernel forced onto the load-ahead kernel (rule or not), built for sm_90a.
_BUILD = """
import dataclasses, sys
from coda_agent.primitives import _quack, backend
from coda_agent.tasks import find_task
from coda_agent.tasks.loader import import_file
chosen, built = _quack.kernel_config, []
def forced(call):
    config = chosen(call)
    config = dataclasses.replace(config, load_ahead=config.split_k == 1)
    built.append(config.load_ahead)
    return config
_quack.kernel_config = forced
task = find_task(sys.argv[1])
human = import_file(task.human_file, "human")
point = task.shapes["small"][0]
with backend.using("quack-compile"):
    human.forward(**task.make_inputs(dict(point.dims), seed=0, device="cpu"), **task.constants)
print(sum(built))
"""


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_every_suite_kernel_builds_on_the_load_ahead_kernel_for_sm90(task, monkeypatch):
    with runner_folder("coda_test_ahead_") as cache:
        monkeypatch.setenv("QUACK_CACHE_DIR", str(cache))
        assert int(_child(_BUILD, task.name).split()[-1]) >= 1
        assert any(cache.rglob("*.o"))


_BUILD_THREE_GROUPS = """
import dataclasses, functools, sys
from pathlib import Path
from unittest import mock
from coda_agent.primitives import Config, _ahead, _quack, backend
from coda_agent.tasks import find_task
from coda_agent.tasks.loader import import_file
three = import_file(Path(sys.argv[1]), "three").ThreeWarpGroupsSm90
tile = Config(tile_m=192, tile_n=192, pingpong=False)
task = find_task("gemm_rmsnorm_bwd")
human = import_file(task.human_file, "human")
def forced(run):  # past gemm()'s check, which refuses this tile with an N-major B on QuACK's layout
    def go(call):
        assert call.b_major == "n"
        epi = dataclasses.replace(call.epi, backend_cache={}, checked_calls={})
        call = dataclasses.replace(call, epi=epi, config=tile)
        with mock.patch.object(_ahead, "AheadEpiMod", functools.partial(_ahead.AheadEpiMod, kernel=three)):
            _quack._epimod(call, True)
        return run(call)
    return go
point = task.shapes["small"][0]
with backend.using("quack-compile", wrap=forced):
    human.forward(**task.make_inputs(dict(point.dims), seed=0, device="cpu"), **task.constants)
"""


@pytest.mark.slow
def test_the_probes_three_warp_groups_build_the_n_major_192x192_tile_for_sm90(monkeypatch):
    """What QuACK's layout cannot build (the DSL's compiler aborts: bench/results/h200-2026-12-03-a-notes.md),
    gemm_rmsnorm_bwd's dgrad GEMM at cuBLAS's 192x192 on its N-major weight, builds with three warp groups."""
    with runner_folder("coda_test_three_groups_") as cache:
        monkeypatch.setenv("QUACK_CACHE_DIR", str(cache))
        _child(_BUILD_THREE_GROUPS, str(REPO / "bench/probes/three_warp_groups.py"))
        assert any(cache.rglob("*.o"))


#: A task's human kernel with every gemm call at a config (``sys.argv[2]``, JSON fields, ``load_ahead`` among
#: them), on the load-ahead kernel or a class of bench/probes/ahead_stages.py (``sys.argv[3]``), built for
#: sm_90a.
_BUILD_AT = """
import dataclasses, functools, json, sys
from pathlib import Path
from unittest import mock
import coda_agent
from coda_agent.primitives import _ahead, backend, configs
from coda_agent.tasks import find_task
from coda_agent.tasks.loader import import_file
probes = import_file(Path(coda_agent.__file__).parents[1] / "bench/probes/ahead_stages.py", "stages")
task = find_task(sys.argv[1])
human = import_file(task.human_file, "human")
tile = configs.config_from_fields(json.loads(sys.argv[2]))
kernel = getattr(probes, sys.argv[3]) if len(sys.argv) > 3 else _ahead.LoadAheadSm90
def forced(run):
    return lambda call: run(dataclasses.replace(call, config=tile, pinned=None))
with mock.patch.object(_ahead, "AheadEpiMod", functools.partial(_ahead.AheadEpiMod, kernel=kernel)):
    with backend.using("quack-compile", wrap=forced):
        human.forward(**task.make_inputs(dict(task.shapes["small"][0].dims), seed=0, device="cpu"),
                      **task.constants)
"""


def _sass(monkeypatch, dump, task: str, config: str, *kernel: str) -> str:
    """The sm_90a SASS of ``task``'s human kernel with every gemm call at ``config`` (on ``kernel``, a class
    of bench/probes/ahead_stages.py, where given)."""
    dump.mkdir()
    monkeypatch.setenv("CUTE_DSL_KEEP", "sass")
    monkeypatch.setenv("CUTE_DSL_DUMP_DIR", str(dump))
    monkeypatch.setenv("QUACK_CACHE_DIR", str(dump / "cache"))
    _child(_BUILD_AT, task, config, *kernel)
    (sass,) = dump.glob("*.sass")
    return sass.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize(("task", "tile"), [
    ("gemm_residual", '"tile_m": 128, "tile_n": 256, "pingpong": false'),
    ("gemm_rmsnorm_bwd", '"tile_m": 128, "tile_n": 192, "pingpong": true'),
    ("gemm_swiglu_bwd", '"tile_m": 128, "tile_n": 192, "pingpong": true'),  # packed: ahead at tile_n > 128
])
def test_the_load_ahead_epilogue_has_a_barrier_and_a_fence_fewer_per_subtile(monkeypatch, tmp_path, task,
                                                                              tile):
    """Issue 44 (bench/notes/2026-12-05-epilogue-probes.md): built for sm_90a, the load-ahead kernel's own
    epilogue stores what QuACK's kernel stores with, for each of a tile's 8 or more subtiles, a named barrier
    fewer, and about as many proxy fences fewer (the subtile loop is unrolled)."""
    import re

    def counts(text: str) -> tuple[int, int, int]:
        return (len(re.findall(r"UTMASTG", text)), len(re.findall(r"BAR\.SYNC", text)),
                len(re.findall(r"FENCE\.VIEW\.ASYNC\.S", text)))

    quacks = _sass(monkeypatch, tmp_path / "quack", task, f'{{{tile}, "load_ahead": false}}')
    stores, bars, fences = counts(quacks)
    ahead = _sass(monkeypatch, tmp_path / "ahead", task, f'{{{tile}, "load_ahead": true}}')
    assert "aheadGemmMod" in ahead or "_ahead" in ahead
    ahead_stores, ahead_bars, ahead_fences = counts(ahead)
    assert ahead_stores == stores > 0
    assert bars - ahead_bars >= 8 and fences - ahead_fences >= 7, (bars, ahead_bars, fences, ahead_fences)


@pytest.mark.slow
def test_the_register_split_spills_under_a_third_of_quacks_at_the_rms_backward_tile(monkeypatch, tmp_path):
    """gemm_rmsnorm_bwd's epilogue at the product's 128x192 pingpong tile spills with QuACK's register split
    for 192 accumulator registers a thread (40 per producer thread, 232 per math thread:
    bench/probes/ahead_stages.py:QuackRegistersSm90); with the load-ahead kernel's (24, 240) it spills under
    a third as much, and the producer warps none."""
    import re

    def spills(*kernel: str) -> int:
        text = _sass(monkeypatch, tmp_path / (kernel or ("ahead",))[0], "gemm_rmsnorm_bwd",
                     '{"tile_m": 128, "tile_n": 192, "pingpong": true, "load_ahead": true}', *kernel)
        producer = text[:text.index("USETMAXREG.TRY_ALLOC")]  # the producer warps' branch comes first
        assert "STL" not in producer[producer.index("USETMAXREG.DEALLOC"):]
        return len(re.findall(r"\bSTL\b", text))

    quacks, ahead = spills("QuackRegistersSm90"), spills()
    assert quacks > 100 and ahead * 3 < quacks, (quacks, ahead)


@pytest.mark.slow
def test_the_probes_narrow_subtiles_build_the_swiglu_backward_at_128x192_unspilled(monkeypatch, tmp_path):
    """bench/probes/ahead_stages.py:NarrowSubtilesSm90 (bench/results/h100-2026-12-06-e-notes.md, call 4):
    the load-ahead kernel spills gemm_swiglu_bwd's packed epilogue at 128x192 pingpong with 64x32 subtiles,
    not with 64x16 ones, which take twice the TMA stores a tile."""
    import re

    config = '{"tile_m": 128, "tile_n": 192, "pingpong": true, "load_ahead": true}'
    wide = _sass(monkeypatch, tmp_path / "wide", "gemm_swiglu_bwd", config)
    narrow = _sass(monkeypatch, tmp_path / "narrow", "gemm_swiglu_bwd", config, "NarrowSubtilesSm90")

    def count(pattern: str, text: str) -> int:
        return len(re.findall(pattern, text))

    assert count(r"\bSTL\b", wide) > 0 and count(r"\bSTL\b", narrow) == count(r"\bLDL\b", narrow) == 0
    assert count(r"UTMASTG", narrow) == 2 * count(r"UTMASTG", wide) > 0


#: QuACK's split at 128x256 cooperative with C, where too little shared memory leaves one A/B stage: as
#: QuACK's kernel runs it, inside and after a refusal block, and as the load-ahead kernel runs it.
_FLOOR = """
import json
from cutlass import BFloat16
from cutlass._mlir import ir
from quack.gemm_sm90 import GemmSm90
from coda_agent.primitives._ahead import LoadAheadSm90
from coda_agent.primitives.quack_patches import StageSplitError, one_stage_mainloop_refused
def split(capacity):
    return ((128, 256, 64), (128, 32), BFloat16, BFloat16, BFloat16, BFloat16, None, capacity, 1)
def refused(run):
    try:
        return run()
    except StageSplitError as e:
        return str(e)
coop = object.__new__(LoadAheadSm90)
coop.pingpong = False
out = {}
with ir.Context(), ir.Location.unknown():
    out["quack"] = GemmSm90._compute_stages(*split(140000))
    with one_stage_mainloop_refused():
        with one_stage_mainloop_refused():
            pass
        out["refused"] = refused(lambda: GemmSm90._compute_stages(*split(140000)))
        out["ahead"] = coop._compute_stages(*split(140000))
        ample = split(232448)
        out["ahead, ample"] = [coop._compute_stages(*ample), LoadAheadSm90.c_deepened_stages(*ample)]
        out["ahead, too small"] = refused(lambda: coop._compute_stages(*split(120000)))
    out["after"] = refused(lambda: GemmSm90._compute_stages(*split(140000)))
print(json.dumps(out))
"""


def test_a_split_leaving_the_mainloop_one_ab_stage_is_refused_on_quacks_kernel_and_rebalanced_ahead():
    """Issue 44's three-warp-group hang (bench/results/h100-2026-12-05-f-hang.log): QuACK's mainloop needs two
    A/B stages. Where QuACK's split leaves one, its kernel's build is refused (nested blocks, QuACK's split
    back after), and the load-ahead kernel takes the second stage out of C's (2 x 48 KiB of A/B, 2 x 8 KiB
    each of C and D within the 136.9 KiB budget); with too little room for even that, it is refused too. Where
    QuACK's split already has two, the load-ahead kernel's cooperative split is the C-deepened one,
    unchanged."""
    out = json.loads(_child(_FLOOR))
    assert out["quack"][0] == 1 and out["after"] == out["quack"]
    assert "fewer than 2 A/B stages" in out["refused"] and "tile 128x256" in out["refused"]
    assert out["ahead"] == [2, 2, 2]
    assert out["ahead, ample"][0] == out["ahead, ample"][1] and out["ahead, ample"][0][0] >= 2
    assert "would never finish" in out["ahead, too small"]


@pytest.mark.slow
def test_gemm_rmsnorm_bwd_at_192x128_cooperative_is_refused_on_quacks_kernel_and_builds_ahead(monkeypatch,
                                                                                             tmp_path):
    """The kernel that never finished on either card: on the CPU, QuACK's kernel's build now says why (one A/B
    stage beside C, h and normed), and the load-ahead kernel builds it (2 A/B, 3 D, 2 C stages; it ran on an
    H100 with the outputs of the kernel as written, h100-2026-12-05-f-floor-probe.log)."""
    monkeypatch.setenv("QUACK_CACHE_DIR", str(tmp_path))
    tile = '"tile_m": 192, "tile_n": 128, "pingpong": false'
    with pytest.raises(AssertionError, match="StageSplitError: tile 192x128"):
        _child(_BUILD_AT, "gemm_rmsnorm_bwd", f'{{{tile}, "load_ahead": false}}')
    _child(_BUILD_AT, "gemm_rmsnorm_bwd", f'{{{tile}, "load_ahead": true}}')
    assert any(tmp_path.rglob("*.o"))


#: The load-ahead kernel's stage split in pingpong beside its split before the buffers per warp group, for the
#: tiles of TILES.
_GROUP_STAGES = """
import json, sys
from cutlass import BFloat16
from cutlass._mlir import ir
from coda_agent.primitives._ahead import LoadAheadSm90
kernel = object.__new__(LoadAheadSm90)
kernel.pingpong = True
out = []
with ir.Context(), ir.Location.unknown():
    for tile, subtile in json.loads(sys.argv[1]):
        args = (tuple(tile), tuple(subtile), BFloat16, BFloat16, BFloat16, BFloat16, None, 232448, 1)
        out.append([LoadAheadSm90.c_deepened_stages(*args), kernel._compute_stages(*args)])
print(json.dumps(out))
"""


def test_in_pingpong_each_warp_group_gets_its_own_d_stages_out_of_c_and_never_ab():
    """Issue 44, item 2: in pingpong, two sets of D buffers of at least 2 stages each, paid for out of C's
    stages (down to 2) and never, at the suite's pingpong tiles, out of A/B's."""
    pingpong = [(tile, sub) for tile, sub in TILES if tile[0] == 128 and tile[1] <= 208]
    split = json.loads(_child(_GROUP_STAGES, json.dumps(pingpong)))
    for (tile, subtile), ((ab, d, c), (ab_g, d_g, c_g)) in zip(pingpong, split, strict=True):
        stage = subtile[0] * subtile[1] * 2
        assert ab_g == ab and d_g % 2 == 0 and d_g >= 4 and c_g >= 2, (tile, (ab, d, c), (ab_g, d_g, c_g))
        assert (d_g + c_g) * stage <= (d + c) * stage + 2048, tile  # the same smem, give or take a pad


def test_a_schedule_the_tuner_pins_on_quacks_kernel_passes_the_static_check():
    """The tune stage pins ``Config(..., load_ahead=False)`` where QuACK's kernel won: the pinned module must
    still pass the static check (it refused every flag but pingpong)."""
    import ast

    from coda_agent.verifier.static.schedule_form import ScheduleFormError, literal_schedule

    call = ast.parse('schedule({("add_c", 1, 2, 3): Config(tile_n=128, load_ahead=False)})').body[0].value
    assert literal_schedule(call) == {("add_c", 1, 2, 3): P.Config(tile_n=128, load_ahead=False)}
    bad = ast.parse('schedule({("add_c", 1, 2, 3): Config(load_ahead=0)})').body[0].value
    with pytest.raises(ScheduleFormError, match="load_ahead, pingpong: True/False"):
        literal_schedule(bad)
