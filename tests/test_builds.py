"""The tune stage's builds: the configs a search will propose, built by CPU processes side by side while
the search times the ones built already; a build that fails is never proposed, and one that kills its process
costs one builder."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from coda_agent.measure.timing import Timing
from coda_agent.primitives import Config
from coda_agent.primitives.configs import SWIZZLE_GROUPS, config_label, swizzled
from coda_agent.tasks import find_task
from coda_agent.verifier.builds import Builds
from coda_agent.verifier.caches import quack_cache_for
from coda_agent.verifier.client import Batch, CandidateRaised, RunnerCancelled, RunnerCrashed
from coda_agent.verifier.plan import Plan
from coda_agent.verifier.stages import Context
from coda_agent.verifier.tuning import GemmSite, TuneCache, proposals, search_shape, start_builds
from coda_agent.verifier.verdict import Outcome

SMALL_KEY = ("rms_bwd", 256, 384, 128)
KILLER = Config(tile_m=320, tile_n=128, pingpong=False)
REFUSED = Config(tile_m=192, tile_n=192, pingpong=False)


class FakeBuilder:
    """A compile-only runner: each build takes ``seconds``; KILLER aborts the process, REFUSED raises."""

    def __init__(self, log, seconds=0.05):
        self.log, self.seconds, self.config = log, seconds, None
        self.cancelled = threading.Event()

    def cancel(self):
        self.cancelled.set()

    def set_schedule(self, table):
        assert set(table) <= {SMALL_KEY}
        self.config = table.get(SMALL_KEY)

    def run(self, calls, keep, dry=False, trace=True):
        assert calls == ["build"] and keep == []
        if trace:  # the op log at the small shape: which gemm calls there are
            return Batch(times_us=[0.0], wall_s=0.0,
                         ops=[[{"gemm": list(SMALL_KEY[1:]), "epilogue": "rms_bwd"}]])
        if self.cancelled.wait(self.seconds):
            raise RunnerCancelled("the verification was cancelled")
        if self.config == KILLER:
            raise RunnerCrashed(
                "the runner process died (exit 134)\n  what():  std::get: wrong index for variant\n")
        if self.config == REFUSED:
            raise CandidateRaised(
                "EpilogueError: invalid Config: cooperative 192x192 splits the tile along N", contract=True)
        self.log.append((threading.get_ident(), self.config, time.monotonic()))
        return Batch(times_us=[0.0], wall_s=0.0)


def starter(log, starts, seconds=0.05):
    @contextmanager
    def start():
        starts.append(time.monotonic())
        yield FakeBuilder(log, seconds)

    return start


def built_all(builds, wanted, seconds=30):
    """Wait for every build of ``wanted``: what failed, with why."""
    until = time.monotonic() + seconds
    return {b: why for b in wanted if (why := builds.wait(b, until)) is not None}


def test_builds_run_side_by_side_and_a_build_that_kills_its_process_costs_one_builder():
    good = [Config(tile_n=n, cluster_m=m, cluster_n=3 - m) for n in (128, 208) for m in (1, 2)]
    wanted = [("rms_bwd", c) for c in [*good[:2], KILLER, REFUSED, *good[2:]]]
    log, starts = [], []
    builds = Builds(starter(log, starts), time.monotonic() + 30, workers=3)
    assert builds.add(wanted + wanted[:1]) == len(wanted)  # each once
    failed = built_all(builds, wanted)
    builds.close()
    assert (failed[("rms_bwd", KILLER)]
            == "its sm_90a build killed the process:   what():  std::get: wrong index for variant")
    assert failed[("rms_bwd", REFUSED)].startswith("does not build for sm_90a: EpilogueError: invalid Config")
    assert (sorted(c.tile_n * 10 + c.cluster_m for _, c, _ in log)
            == sorted(c.tile_n * 10 + c.cluster_m for c in good))
    assert len({thread for thread, _, _ in log}) > 1  # side by side, each build once
    assert len(starts) == 3 + 1  # three builders, one of them started again after the abort
    assert builds.counts == {"queued": 6, "built": 4, "failed": 2, "skipped": 0}


def test_the_deadline_ends_the_builds_and_what_it_cut_off_is_not_a_failure():
    wanted = [("rms_bwd", Config(tile_n=n)) for n in (128, 160, 192, 208)]
    log, starts = [], []
    began = time.monotonic()
    builds = Builds(starter(log, starts, seconds=0.4), began + 0.6, workers=1)
    builds.add(wanted)
    assert built_all(builds, wanted) == {} and 1 <= len(log) < len(wanted) and time.monotonic() - began < 3


def test_a_builder_whose_runner_cannot_start_gives_up_after_two_tries():
    starts = []

    @contextmanager
    def broken():
        starts.append(1)
        raise RunnerCrashed("the runner process died (exit 1)")
        yield

    builds = Builds(broken, time.monotonic() + 30, workers=1)
    builds.add([("rms_bwd", Config(tile_n=128))])
    began = time.monotonic()
    # no builder left: the GPU runner builds it
    assert builds.wait(("rms_bwd", Config(tile_n=128)), began + 30) is None and time.monotonic() - began < 5
    assert len(starts) == 2


def test_the_search_times_each_config_once_its_own_build_is_done_not_once_every_build_is():
    """At the H200 a shape's 36 builds, all made before its search, took the whole 45 s budget and the search
    timed one config. Now each proposal waits for its own build only: the first is timed while the builders
    are still at work on the rest."""
    site = GemmSite(("rms_bwd", 8192, 4096, 28672), "element", True, None)
    log, starts = [], []
    builds = Builds(starter(log, starts, seconds=0.2), time.monotonic() + 30, workers=2)
    builds.start()
    builds.add(proposals([site], {"rms_bwd": "rms_bwd:x"}, TuneCache(None, "H200")))
    timer = FlatTimer()
    _, (call,), _ = search_shape([site], timer, deadline=time.monotonic() + 30, cache=TuneCache(None, "H200"),
                                 signatures={}, ready=builds.wait)
    builds.close()
    built_at = {config: at for _, config, at in log}
    proposed = [(config, at) for table, at in zip(timer.asked[1:], timer.at[1:], strict=True)
                for config in table.values()]
    tiles, groups = proposed[:-2], proposed[-2:]
    assert len(tiles) == len(site.space()) - 1 - 2 and len(call.failed) == 2  # KILLER and REFUSED
    assert all(at >= built_at[config] for config, at in tiles)  # each after its own build
    assert tiles[0][1] < max(built_at.values()) - 0.5  # the first long before the last build
    # then the fastest tile (here the one as written) at the other swizzle groups: a runtime value, no build
    assert [config for config, _ in groups] == swizzled(site.effective) and not set(built_at) & set(swizzled(
        site.effective))


class GatedBuilder(FakeBuilder):
    """A build begins (``began`` is set) and then waits for the test to ``release`` it, or for a cancel."""

    def __init__(self, log, began, release):
        super().__init__(log)
        self.began, self.release = began, release

    def run(self, calls, keep, dry=False, trace=True):
        if trace:
            return super().run(calls, keep, dry, trace)
        self.began.set()
        while not self.release.wait(0.01):
            if self.cancelled.is_set():
                raise RunnerCancelled("the verification was cancelled")
        self.release.clear()
        self.log.append((threading.get_ident(), self.config, time.monotonic()))
        return Batch(times_us=[0.0], wall_s=0.0)


def test_a_search_that_ends_drops_the_builds_it_did_not_reach_and_close_cancels_the_ones_under_way():
    wanted = [("rms_bwd", Config(tile_n=n)) for n in (128, 160, 192, 208)]
    log, began, release = [], threading.Event(), threading.Event()

    @contextmanager
    def start():
        yield GatedBuilder(log, began, release)

    builds = Builds(start, time.monotonic() + 30, workers=1)
    builds.add(wanted)
    assert began.wait(5)
    began.clear()
    builds.skip()  # the search ended: what it did not reach is dropped, the build under way finishes
    release.set()
    assert builds.wait(wanted[0], time.monotonic() + 5) is None and len(log) == 1
    assert builds.counts["skipped"] == 3
    assert builds.add(wanted) == 3  # a later shape queues them again; the one built is not built twice
    assert began.wait(5)
    began_close = time.monotonic()
    builds.close()
    assert builds.wait(wanted[1], began_close + 5) is None and time.monotonic() - began_close < 1  # cancelled
    assert len(log) == 1 and builds.counts == {"queued": 7, "built": 1, "failed": 0, "skipped": 6}


class FlatTimer:
    """Every schedule takes 1000 µs; remembers what it was asked to time."""

    def __init__(self):
        self.asked, self.at, self.seconds = [], [], {}

    def measure(self, table):
        self.asked.append(dict(table))
        self.at.append(time.monotonic())
        return Timing(median_us=1000.0)


def test_the_search_never_proposes_a_config_whose_build_failed():
    site = GemmSite(("rms_bwd", 8192, 4096, 28672), "element", True, None)
    why = "its sm_90a build killed the process:   what():  std::get: wrong index for variant"
    timer = FlatTimer()
    _, (call,), _ = search_shape([site], timer, deadline=1e9, cache=TuneCache(None, "H200"), signatures={},
                                 ready=lambda build, until: why if build == ("rms_bwd", KILLER) else None)
    assert call.failed == {config_label(KILLER): f"{Outcome.COMPILE_ERROR.value}: {why}"}
    # as written first
    assert (all(KILLER not in table.values() for table in timer.asked)
            and len(timer.asked) == 1 + len(site.space()) - 2 + len(SWIZZLE_GROUPS) - 1)


def test_the_builders_build_a_shapes_proposals_for_sm90_into_the_candidates_cache_and_the_runner_has_the_last_word(  # noqa: E501
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
    signatures, cache = {"rms_bwd": "rms_bwd:x"}, TuneCache(None, "cpu")
    builds = start_builds(ctx, time.monotonic() + 240)
    try:
        wanted = proposals([lying], signatures, cache)
        assert wanted == [("rms_bwd", Config(tile_n=128)), ("rms_bwd", KILLER)]  # not the config as written
        assert builds.add(wanted) == 2
        failed = built_all(builds, wanted, seconds=240)
        assert list(failed) == [("rms_bwd", KILLER)] and "N-major B" in failed["rms_bwd", KILLER]
        kernels = list(quack_cache_for(source).rglob("*.o"))
        assert len(kernels) == 2  # the config as written (the small shape's traced call) and 128x128
        assert builds.add(wanted) == 0  # a later shape does not build them again
    finally:
        builds.close()
    assert ctx.watch.parts == {}  # beside the search: the builders' runners are not among the stage's parts
