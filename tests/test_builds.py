"""The tune stage's builds: the configs a shape's search will propose, built by CPU processes side by side
before the GPU times them; a build that fails is never proposed, and one that kills its process costs one
builder."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from coda_agent.measure.timing import Timing
from coda_agent.primitives import Config
from coda_agent.primitives.configs import config_label
from coda_agent.tasks import find_task
from coda_agent.verifier.builds import build_configs
from coda_agent.verifier.caches import quack_cache_for
from coda_agent.verifier.client import Batch, CandidateRaised, RunnerCrashed
from coda_agent.verifier.plan import Plan
from coda_agent.verifier.stages import Context
from coda_agent.verifier.tuning import GemmSite, TuneCache, prebuild, search_shape
from coda_agent.verifier.verdict import Outcome

SMALL_KEY = ("rms_bwd", 256, 384, 128)
KILLER = Config(tile_m=320, tile_n=128, pingpong=False)
REFUSED = Config(tile_m=192, tile_n=192, pingpong=False)


class FakeBuilder:
    """A compile-only runner: each build takes ``seconds``; KILLER aborts the process, REFUSED raises."""

    def __init__(self, log, seconds=0.05):
        self.log, self.seconds, self.config = log, seconds, None

    def set_schedule(self, table):
        assert set(table) <= {SMALL_KEY}
        self.config = table.get(SMALL_KEY)

    def run(self, calls, keep, dry=False, trace=True):
        assert calls == ["build"] and keep == []
        if trace:  # the op log at the small shape: which gemm calls there are
            return Batch(times_us=[0.0], wall_s=0.0,
                         ops=[[{"gemm": list(SMALL_KEY[1:]), "epilogue": "rms_bwd"}]])
        time.sleep(self.seconds)
        if self.config == KILLER:
            raise RunnerCrashed(
                "the runner process died (exit 134)\n  what():  std::get: wrong index for variant\n")
        if self.config == REFUSED:
            raise CandidateRaised(
                "EpilogueError: invalid Config: cooperative 192x192 splits the tile along N", contract=True)
        self.log.append((threading.get_ident(), self.config))
        return Batch(times_us=[0.0], wall_s=0.0)


def starter(log, starts, seconds=0.05):
    @contextmanager
    def start():
        starts.append(time.monotonic())
        yield FakeBuilder(log, seconds)

    return start


def test_builds_run_side_by_side_and_a_build_that_kills_its_process_costs_one_builder():
    good = [Config(tile_n=n, cluster_m=m, cluster_n=3 - m) for n in (128, 208) for m in (1, 2)]
    wanted = [("rms_bwd", c) for c in [*good[:2], KILLER, REFUSED, *good[2:]]]
    log, starts = [], []
    failed = build_configs(wanted + wanted[:1], starter(log, starts), time.monotonic() + 30, workers=3)
    assert (failed[("rms_bwd", KILLER)]
            == "its sm_90a build killed the process:   what():  std::get: wrong index for variant")
    assert failed[("rms_bwd", REFUSED)].startswith("does not build for sm_90a: EpilogueError: invalid Config")
    assert (sorted(c.tile_n * 10 + c.cluster_m for _, c in log)
            == sorted(c.tile_n * 10 + c.cluster_m for c in good))
    assert len({thread for thread, _ in log}) > 1  # side by side, each build once
    assert len(starts) == 3 + 1  # three builders, one of them started again after the abort


def test_the_deadline_ends_the_builds_and_what_it_cut_off_is_not_a_failure():
    wanted = [("rms_bwd", Config(tile_n=n)) for n in (128, 160, 192, 208)]
    log, starts = [], []
    began = time.monotonic()
    failed = build_configs(wanted, starter(log, starts, seconds=0.4), began + 0.6, workers=1)
    assert failed == {} and 1 <= len(log) < len(wanted) and time.monotonic() - began < 3


def test_a_builder_whose_runner_cannot_start_gives_up_after_two_tries():
    starts = []

    @contextmanager
    def broken():
        starts.append(1)
        raise RunnerCrashed("the runner process died (exit 1)")
        yield

    assert build_configs([("rms_bwd", Config(tile_n=128))], broken, time.monotonic() + 30, workers=1) == {}
    assert len(starts) == 2


class FlatTimer:
    """Every schedule takes 1000 µs; remembers what it was asked to time."""

    def __init__(self):
        self.asked, self.seconds = [], {}

    def measure(self, table):
        self.asked.append(dict(table))
        return Timing(median_us=1000.0)


def test_the_search_never_proposes_a_config_whose_build_failed():
    site = GemmSite(("rms_bwd", 8192, 4096, 28672), "element", True, None)
    why = "its sm_90a build killed the process:   what():  std::get: wrong index for variant"
    timer = FlatTimer()
    _, (call,), _ = search_shape([site], timer, deadline=1e9, cache=TuneCache(None, "H200"), signatures={},
                                 unbuildable={("rms_bwd", KILLER): why})
    assert call.failed == {config_label(KILLER): f"{Outcome.COMPILE_ERROR.value}: {why}"}
    # as written first
    assert (all(KILLER not in table.values() for table in timer.asked)
            and len(timer.asked) == 1 + len(site.space()) - 2)


def test_prebuild_builds_a_shapes_proposals_for_sm90_into_the_candidates_cache_and_the_runner_has_the_last_word(  # noqa: E501
        scratch, monkeypatch):
    """Real sm_90a builds on the CPU. The op log claims a K-major B for gemm_rmsnorm_bwd's call, so the space
    holds the tiles split along N; the builder's runner checks B as it is and refuses them, and they are not
    proposed."""
    monkeypatch.setenv("QUACK_CACHE_DIR", str(scratch))  # a folder the runners reach as nobody too
    task = find_task("gemm_rmsnorm_bwd")
    source = task.human_file.read_text()
    ctx = Context(task=task, source=source, plan=Plan(), deadline=time.monotonic() + 280)
    lying = GemmSite(("rms_bwd", 8192, 4096, 28672), "element", True, None, b_major="k")
    monkeypatch.setattr(GemmSite, "space", lambda self: [Config(), Config(tile_n=128), KILLER])
    built: set = set()
    count, failed = prebuild(ctx, [lying], {"rms_bwd": "rms_bwd:x"}, TuneCache(None, "cpu"), built,
                             time.monotonic() + 240)
    assert (count == 2
            and built == {("rms_bwd", Config()), ("rms_bwd", Config(tile_n=128)), ("rms_bwd", KILLER)})
    assert list(failed) == [("rms_bwd", KILLER)] and "N-major B" in failed["rms_bwd", KILLER]
    kernels = list(quack_cache_for(source).rglob("*.o"))
    assert len(kernels) == 2  # the config as written (the small shape's traced call) and 128x128
    again, _ = prebuild(ctx, [lying], {"rms_bwd": "rms_bwd:x"}, TuneCache(None, "cpu"), built,
                        time.monotonic() + 60)
    assert again == 0  # a later shape does not build them again
    narrow = GemmSite(("rms_bwd", 8192, 2048, 16384), "element", True, Config(tile_n=128), b_major="k")
    assert prebuild(ctx, [narrow], {"rms_bwd": "rms_bwd:x"}, TuneCache(None, "cpu"), built,
                    time.monotonic() + 60)[0] == 0
