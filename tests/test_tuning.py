"""The harness owns the schedule: the runner's override and op log, the tune stage's search, its cache, and
the tuned configs pinned in the candidate's source. On the CPU through the emulator (configs accepted and
ignored, host times); the search's choices are checked under a deterministic timing seam. The H200 test is
marked gpu."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from coda_agent.measure.timing import RepPlan, Timing
from coda_agent.primitives import Config
from coda_agent.primitives.configs import SWIZZLE_GROUPS, config_label, config_space, swizzled
from coda_agent.tasks import find_task
from coda_agent.verifier import Plan, TuningFailed, tune_plan, tune_schedule, tuning, verify
from coda_agent.verifier.client import RunnerCrashed
from coda_agent.verifier.gpu import BATCH, ShapeTimer
from coda_agent.verifier.stages import Context, Reject
from coda_agent.verifier.static import check_source
from coda_agent.verifier.static.schedule_form import ScheduleFormError
from coda_agent.verifier.static.schedule_source import (
    pin_schedule,
    pinned_notes,
    pinned_schedule,
    unpinned,
    without_schedule,
)
from coda_agent.verifier.tuning import (
    MAX_RESTARTS,
    GemmSite,
    ScheduleTimer,
    SearchRunner,
    TuneCache,
    gemm_sites,
    search_shape,
)
from coda_agent.verifier.verdict import Outcome, ShapeTuning, TunedGemm, Verdict

TASK = find_task("gemm_residual_rmsnorm")
HUMAN = TASK.human_file.read_text()
#: A config of the space that is not the default: the deterministic timers below make it the winner.
WINNER = Config(tile_m=256, tile_n=160, pingpong=False, cluster_m=1, cluster_n=2)
PASSED = Verdict(task=TASK.name, task_version=TASK.version, backend="torch", outcome=Outcome.PASSED)


def small_key(point) -> tuple[str, int, int, int]:
    d = point.dims
    return ("residual_rms", d["M"], d["N"], d["K"])


# --- the runner: what it reports, what it applies -------------------------------------------------------


def test_the_runner_logs_each_gemm_calls_config_and_runs_under_the_harness_schedule():
    point = TASK.shape("small")[0]
    key = small_key(point)
    ctx = Context(task=TASK, source=HUMAN, plan=Plan(), deadline=time.monotonic() + 120)
    with ctx.runner("torch", "cpu") as client:
        client.put("s", TASK.make_inputs(point.dims, 0))
        (ops,) = client.run(["s"], keep=[0]).ops
        (as_written,) = client.fetch(1 << 30)
        (gemm,) = [op for op in ops if "gemm" in op]
        assert gemm["gemm"] == list(key[1:]) and gemm["epilogue"] == "residual_rms"
        # the schedule pins only bench shapes
        assert (gemm["mode"] == "element" and gemm["outputs"] == 1 and gemm["config"] is None
                and gemm["b_major"] == "k")
        client.set_schedule({key: WINNER})
        (ops,) = client.run(["s"], keep=[0]).ops
        (scheduled,) = client.fetch(1 << 30)
        assert [op["config"] for op in ops if "gemm" in op] == [WINNER.__dict__]
        # the emulator ignores configs
        assert all(scheduled.tensors[k].equal(v) for k, v in as_written.tensors.items())
        client.set_schedule({})
        (ops,) = client.run(["s"], keep=[]).ops
        assert [op["config"] for op in ops if "gemm" in op] == [None]


# --- the search, under a deterministic timing seam ------------------------------------------------------


class FakeTimer:
    """Times a schedule by a rule; remembers what it was asked to time. ``clock`` advances 1 s per
    measurement."""

    def __init__(self, cost, fail=()):
        self.cost, self.fail, self.asked, self.now = cost, fail, [], 0.0
        self.seconds = {"warm-up": 0.75}

    def measure(self, table):
        self.asked.append(dict(table))
        self.now += 1.0
        if any(c in self.fail for c in table.values()):
            raise Reject(Outcome.RUNTIME_ERROR,
                         "forward() raised while timed at shape s:\nRuntimeError: bad config")
        return Timing(median_us=self.cost(table))

    def compare(self, table):
        return Timing(median_us=self.cost({})), Timing(median_us=self.cost(table))

    def clock(self):
        return self.now


A = ("first", 4096, 4096, 4096)
B = ("second", 4096, 1024, 4096)
SITES = [GemmSite(A, "element", False, None), GemmSite(B, "element", False, Config(tile_n=208))]


def rule(table):
    """1000 µs as written; A's winner saves 100 µs, B's 50 µs, only with A already tuned (a coordinate
    descent)."""
    us = 1000.0
    if table.get(A) == WINNER:
        us -= 100.0
        if table.get(B) == Config(tile_n=256, tile_m=128, pingpong=False):
            us -= 50.0
    return us


def test_the_search_keeps_the_fastest_config_per_call_one_call_at_a_time():
    timer = FakeTimer(rule)
    chosen, calls, written = search_shape(SITES, timer, deadline=1e9, cache=TuneCache(None, "H200"),
                                          signatures={})
    assert (chosen == {A: WINNER, B: Config(tile_n=256, tile_m=128, pingpong=False)}
            and written.median_us == 1000.0)
    first, second = calls
    space = config_space("element", False)
    assert first.written is None and first.tuned == WINNER and not first.cached
    # as written (QuACK's default), every other tile, then the winner's other swizzle groups
    swizzles = {config_label(c) for c in swizzled(WINNER)}
    assert set(first.tried_us) == {config_label(c) for c in space if c != Config()} | {"default"} | swizzles
    assert second.tried_us[config_label(Config(tile_n=208))] == 900.0  # as written, after A's winner
    # B's written config is in the space: not tried twice
    assert len(second.tried_us) == len(space) + len(SWIZZLE_GROUPS) - 1
    # B was searched with A's winner in place
    assert all(t.get(A) == WINNER for t in timer.asked[len(space) + len(swizzles):])
    # the timing protocol's parts, beside the proposal's
    assert first.seconds[config_label(WINNER)]["warm-up"] == 0.75
    # every proposal's cost, not the config as written
    assert set(first.seconds) == set(first.tried_us) - {"default"}


def test_a_starved_call_is_searched_with_split_k_too_and_the_op_log_says_whether_it_stores_d():
    starved = ("small", 1024, 2048, 8192)
    ops = [{"gemm": [1024, 2048, 8192], "epilogue": "small", "mode": "element", "outputs": 0, "config": None},
           {"gemm": [1024, 2048, 8192], "epilogue": "no_d", "mode": "element", "outputs": 1, "config": None,
            "store_d": False}]
    site, no_d = gemm_sites(ops)
    assert site.store_d and not no_d.store_d
    split = Config(tile_n=128, split_k=2)
    timer = FakeTimer(lambda table: 800.0 if table.get(starved) == split else 1000.0)
    chosen, (result,
             ), _ = search_shape([site], timer, deadline=1e9, cache=TuneCache(None, "H200"), signatures={})
    assert chosen == {starved: split} and config_label(split) in result.tried_us
    timer = FakeTimer(lambda table: 1000.0)
    search_shape([no_d], timer, deadline=1e9, cache=TuneCache(None, "H200"), signatures={})
    assert all(c.split_k == 1 for table in timer.asked for c in table.values())


def test_a_call_with_an_n_major_b_is_never_searched_with_a_tile_quack_cannot_build_for_it():
    """A cooperative tile split along N aborts the CuTe DSL compiler with an N-major B (gemm_rmsnorm_bwd's dz
    @ w): the op log says which layout B has, and the search leaves those tiles out rather than lose a runner
    to each."""
    op = {"gemm": [8192, 4096, 28672], "epilogue": "rms_bwd", "mode": "element", "outputs": 1, "config": None}
    (n_major,) = gemm_sites([{**op, "b_major": "n"}])
    (k_major,) = gemm_sites([op])
    assert n_major.b_major == "n" and k_major.b_major == "k"
    asked = {}
    for site in (n_major, k_major):
        timer = FakeTimer(lambda table: 1000.0)
        search_shape([site], timer, deadline=1e9, cache=TuneCache(None, "H200"), signatures={})
        asked[site.b_major] = {c for table in timer.asked for c in table.values()}
    assert (not any(c.splits_n for c in asked["n"])
            and asked["k"] - asked["n"] == {c for c in asked["k"] if c.splits_n})
    assert len(asked["k"] - asked["n"]) == 4


def test_the_search_stops_at_the_budget_and_caches_only_finished_searches():
    timer, cache = FakeTimer(rule), TuneCache(None, "H200")
    chosen, calls, _ = search_shape(SITES, timer, deadline=4.0, cache=cache, signatures={}, clock=timer.clock)
    assert len(timer.asked) == 4  # as written, then proposals while the clock is short of the deadline
    first, second = calls  # each call its share of what was left: A two proposals (until 2.5 s), then B one
    assert len(first.tried_us) == 1 + 2 and len(second.tried_us) == 1 + 1
    # what each proposal cost, by the clock
    assert [s["proposal"] for s in first.seconds.values()] == [1.0, 1.0]
    assert chosen == {} and cache.entries == {}  # A's winner lies past the budget; neither search finished
    space = [len([c for c in site.space() if c != site.effective]) for site in SITES]
    # the record says what the budget left: the tiles not reached, and the swizzle groups after them
    more = len(SWIZZLE_GROUPS) - 1
    assert (first.untried, second.untried) == (space[0] - 2 + more, space[1] - 1 + more)


def test_a_search_cut_short_goes_on_from_what_it_chose_with_the_configs_it_did_not_reach():
    """The second pass (:func:`run_tune`): a shape's search that its share cut short is searched again from
    the schedule it chose, measured afresh, proposing only the configs it had not reached; what it tried
    stays in the record, and the finished search is cached."""
    timer, cache = FakeTimer(rule), TuneCache(None, "H200")
    _, cut, _ = search_shape(SITES, timer, deadline=4.0, cache=cache, signatures={}, clock=timer.clock)
    assert all(c.untried for c in cut) and cache.entries == {}
    cut[0].tried_us[config_label(WINNER)] = 900.0  # say the first pass had found A's winner before the cut
    cut[0].tuned = WINNER
    again = FakeTimer(rule)
    chosen, calls, written = search_shape(SITES, again, deadline=1e9, cache=cache, signatures={},
                                          earlier=cut)
    assert written.median_us == 1000.0 and again.asked[:2] == [{}, {A: WINNER}]  # as written, then the choice
    proposed = [t for t in again.asked[2:]]
    space = [len([c for c in site.space() if c != site.effective]) for site in SITES]
    first, second = calls
    # nothing proposed twice: A's proposals are the ones the first search had not reached, and its winner's
    # swizzle groups
    assert (sum(1 for t in proposed if set(t) == {A})
            == space[0] - (len(cut[0].tried_us) - 1) + len(SWIZZLE_GROUPS) - 1)
    assert set(cut[0].tried_us) <= set(first.tried_us) and first.untried == second.untried == 0
    assert chosen == {A: WINNER, B: Config(tile_n=256, tile_m=128, pingpong=False)}
    assert len(cache.entries) == 2  # both searches finished now


def test_the_fastest_tile_is_tried_at_the_other_swizzle_groups_and_one_pins_as_a_config_literal():
    """The tile scheduler's swizzle group is a runtime value of the kernel: once a call's tiles are searched,
    its fastest is timed at the other groups; a group faster by tuning.MIN_GAIN is chosen and pinned like
    any other config field, and the static check accepts the pin."""
    wide = Config(tile_m=256, tile_n=160, pingpong=False, cluster_m=1, cluster_n=2, max_swizzle_size=16)
    timer = FakeTimer(lambda table: {WINNER: 900.0, wide: 870.0}.get(table.get(A), 1000.0))
    chosen, (first,), _ = search_shape(SITES[:1], timer, deadline=1e9, cache=TuneCache(None, "H200"),
                                       signatures={})
    assert chosen == {A: wide} and first.tuned == wide
    assert first.tried_us[config_label(wide)] == 870.0 and config_label(wide).endswith(" swizzle 16")
    assert first.tried_us[config_label(dataclasses.replace(wide, max_swizzle_size=4))] == 1000.0
    # the groups come after every tile, as the last proposals
    assert [t[A].max_swizzle_size for t in timer.asked[-2:]] == [16, 4]
    pinned = pin_schedule(HUMAN, {("residual_rms", 1, 2, 3): wide}, ["tuned"])
    assert "max_swizzle_size=16" in pinned and check_source(pinned) == []
    # a group within the noise of the tile's time (0.4% here) is not taken
    timer = FakeTimer(lambda table: {WINNER: 900.0, wide: 896.5}.get(table.get(A), 1000.0))
    chosen, _, _ = search_shape(SITES[:1], timer, deadline=1e9, cache=TuneCache(None, "H200"), signatures={})
    assert chosen == {A: WINNER}


def test_a_config_that_fails_is_recorded_and_skipped():
    timer = FakeTimer(rule, fail=(WINNER,))
    chosen, (first,
             ), _ = search_shape(SITES[:1], timer, deadline=1e9, cache=TuneCache(None, "H200"), signatures={})
    assert (WINNER not in chosen.values()
            and first.failed[config_label(WINNER)].startswith("runtime_error: RuntimeError: bad config"))


def test_a_finished_search_is_cached_by_epilogue_source_shape_and_device(tmp_path):
    path = tmp_path / "tuned.json"
    signatures = {"first": "first:abc", "second": "second:def"}
    cache = TuneCache(path, "NVIDIA H200")
    search_shape(SITES, FakeTimer(rule), deadline=1e9, cache=cache, signatures=signatures)
    cache.save()
    assert len(json.loads(path.read_text())["entries"]) == 2
    again = FakeTimer(rule)
    chosen, calls, _ = search_shape(SITES, again, deadline=1e9, cache=TuneCache(path, "NVIDIA H200"),
                                    signatures=signatures)
    # only the as-written time
    assert again.asked == [{}] and all(c.cached for c in calls) and chosen[A] == WINNER
    other_device = FakeTimer(rule)
    search_shape(SITES, other_device, deadline=1e9, cache=TuneCache(path, "NVIDIA H100"),
                 signatures=signatures)
    edited = FakeTimer(rule)
    search_shape(SITES, edited, deadline=1e9, cache=TuneCache(path, "NVIDIA H200"),
                 signatures={**signatures, "first": "first:new"})
    assert len(other_device.asked) > 1 and len(edited.asked) > 1


def test_the_epilogue_signature_follows_the_whole_module_but_not_its_pinned_schedule():
    """A helper or a constant the epilogue uses changes its kernel, so another module never shares a search;
    the harness's own pin (the tuned module) does."""
    base = tuning.epilogue_signature(HUMAN, "residual_rms")
    assert base.startswith("residual_rms:")
    pinned = pin_schedule(HUMAN, {("residual_rms", 1, 2, 3): Config(tile_n=128)}, ["tuned: 1.10x"])
    assert pinned != HUMAN and tuning.epilogue_signature(pinned, "residual_rms") == base
    assert (tuning.epilogue_signature(HUMAN.replace("@epilogue(", "OTHER = 1\n@epilogue(", 1), "residual_rms")
            != base)
    assert tuning.epilogue_signature(HUMAN.replace("h = acc + c", "h = c + acc"), "residual_rms") != base


# --- the schedule in the source ---------------------------------------------------------------------------


def test_unpinning_takes_the_pin_its_notes_and_the_imports_only_it_used_out_and_nothing_else():
    bare = unpinned(HUMAN)  # the human kernel pins its bench shapes
    assert "@schedule" in HUMAN and unpinned(bare) == bare  # nothing pinned: as given
    out = unpinned(pin_schedule(bare, {("residual_rms", 1, 2, 3): Config(tile_n=128)}, ["tuned: 1.10x"]))
    assert out == bare and "coda-agent tune" not in out and "schedule" not in out.split("def ")[0]
    assert without_schedule(out) == without_schedule(HUMAN) and check_source(out) == []
    # a Config the kernel itself uses stays imported
    uses = bare.replace("gemm(residual_rms, x, w.t(),", "gemm(residual_rms, x, w.t(), config=Config(),", 1)
    uses = pin_schedule(uses, {("residual_rms", 1, 2, 3): Config(tile_n=128)})
    assert "config=Config()" in uses and check_source(unpinned(uses)) == []


def test_pinning_adds_the_decorator_and_imports_and_a_retune_replaces_them():
    source = (  # imports neither Config nor schedule
        '"""GEMM + residual."""\n\nfrom coda_agent.primitives import epilogue, gemm\n\n\n@epilogue()\n'
        'def add_residual(acc, c):\n    return {"D": acc + c}\n\n\n'
        'def forward(x, w, residual):\n    return {"out": gemm(add_residual, x, w.t(), C=residual)["D"]}\n'
    )
    key = ("add_residual", 8192, 4096, 14336)
    pinned = pin_schedule(source, {key: WINNER}, ["configs pinned on a test", "  big: 10.0 -> 9.0 µs"])
    assert check_source(pinned) == [] and pinned_schedule(pinned) == {key: WINNER}
    # merged into the module's own import line, in isort's order (a pinned best.py stays lint-clean)
    assert "from coda_agent.primitives import Config, epilogue, gemm, schedule\n" in pinned
    assert pinned.count("import") == source.count("import")
    assert ("# coda-agent tune: configs pinned on a test\n# coda-agent tune:   big: 10.0 -> 9.0 µs\n"
            f"@schedule({{\n    {key!r}: ") in pinned
    other = ("add_residual", 8192, 4096, 4096)
    again = pin_schedule(pinned, {other: Config(tile_n=208), key: Config()}, ["a second tune"])
    assert pinned_schedule(again) == {key: Config(), other: Config(tile_n=208)}
    assert (again.count("@schedule(") == 1 and again.count("# coda-agent tune:") == 1
            and again.count("import Config, epilogue, gemm, schedule") == 1)
    assert check_source(again) == []


def test_pinning_works_beside_a_module_alias_and_refuses_a_name_clash():
    source = (
        "import coda_agent.primitives as P\n\n\n@P.epilogue()\ndef e(acc):\n    return {}\n\n\n"
        "def forward(x, w):\n    return {'y': P.gemm(e, x, w.t())['D']}"
    )
    pinned = pin_schedule(source, {("e", 1, 2, 3): WINNER})
    assert check_source(pinned) == [] and pinned_schedule(pinned) == {("e", 1, 2, 3): WINNER}
    with pytest.raises(ScheduleFormError, match="binds Config itself"):
        pin_schedule(source.replace("\n\n\n@P", "\nConfig = 3\n\n\n@P"), {("e", 1, 2, 3): WINNER})


# --- the stage and the tuner on the emulator --------------------------------------------------------------


def test_the_cpu_tune_stage_searches_every_gemm_call_at_each_shape():
    plan = Plan(stages=["tune_cpu"], shape_names=["tiny"], tune_budget_s=2.0, tune_cache=False)
    verdict = verify(TASK, HUMAN, plan)
    assert verdict.passed, verdict.reason
    result = verdict.stage("tune_cpu")
    (call,) = result.tuning["tiny"].calls
    assert (call.epilogue, *call.mnk) == small_key(TASK.shape("small")[0]) and call.mode == "element"
    space = config_space("element", True, call.mnk, reads_tiles=True)  # it reads C: both kernels at each tile
    assert 1 <= len(call.tried_us) + len(call.failed) <= len(space) + len(SWIZZLE_GROUPS)
    assert result.tuning["tiny"].before.median_us > 0 and result.details["device"] == "cpu"
    # where the stage's time went: the runner, the shape's traced call, its search, comparison and close (no
    # builds on the emulator), each measured
    assert {"runner start", "traced call", "search", "close",
            "runner stop"} <= set(result.seconds_by_part) <= {
        "runner start", "traced call", "search", "comparison", "close", "runner stop"}
    assert (all(v >= 0 for v in result.seconds_by_part.values())
            and sum(result.seconds_by_part.values()) <= result.seconds + 0.01)


class Deterministic(tuning.ScheduleTimer):
    """The real runner and protocol up to the clock: a schedule that pins WINNER for a call is 20% faster."""

    def measure(self, table):
        return Timing(median_us=100.0 if WINNER in table.values() else 120.0)

    def compare(self, table):
        return self.measure({}), self.measure(table)


def test_the_tuner_pins_the_winners_and_the_result_passes_the_verifier(monkeypatch):
    monkeypatch.setattr(tuning, "ScheduleTimer", Deterministic)
    result = tune_schedule(TASK, HUMAN, PASSED, tune_plan("tune_cpu", "small", 60))
    assert result is not None and result.source is not None
    tuned = result.source
    assert set(result.search) == {p.name for p in TASK.shape("small")}
    assert all(WINNER in [c.tuned for c in s.calls] and s.calls[0].tried_us for s in result.search.values())
    assert (pinned_schedule(tuned)
            == {**pinned_schedule(HUMAN), **{small_key(p): WINNER for p in TASK.shape("small")}})
    assert "# coda-agent tune:   tiny: 120.0 -> 100.0 us" in tuned
    # the earlier tune's notes of the shapes this one did not time stay, beside the configs they measured
    earlier = pinned_notes(HUMAN)
    assert "  llama3-8b-down: 1227.0 -> 1200.4 us" in earlier
    small = [p.name for p in TASK.shape("small")]
    # re-timed: its old line goes
    assert "ragged" in small and any(n.startswith("  ragged: ") for n in earlier)
    assert pinned_notes(tuned) == [f"  {n}: 120.0 -> 100.0 us" for n in small] + [
        n for n in earlier if not n.startswith("  ragged: ")]
    assert tuned.count("configs pinned by the harness's tune stage") == 1
    # QuACK builds the pinned config for sm_90a
    verdict = verify(TASK, tuned, Plan(stages=["correctness", "compile"], seeds=[0]))
    assert verdict.passed, verdict.reason


def test_the_tuner_returns_nothing_when_no_config_beats_the_written_ones(monkeypatch):
    class Flat(Deterministic):
        def measure(self, table):
            return Timing(median_us=100.0 if WINNER in table.values() else 100.5)  # 0.5%: noise, not a win

    monkeypatch.setattr(tuning, "ScheduleTimer", Flat)
    flat = tune_schedule(TASK, HUMAN, PASSED, tune_plan("tune_cpu", "small", 60))
    # searched, nothing won: the record says so
    assert flat is not None and flat.source is None and flat.search


def test_a_host_bound_forward_is_tuned_by_the_gpus_time_not_its_host_time(monkeypatch):
    """A config changes the kernels only: where forward()'s host time sets the wall clock (the tune demo's
    decode shape on the H200: 311 µs of host time around a 105 µs kernel), the search and the pin go by the
    CUDA events."""

    class HostBound(Deterministic):
        def measure(self, table):
            gpu = 50.0 if WINNER in table.values() else 105.0
            wall = 300.0 if WINNER in table.values() else 290.0  # the host's noise favours the slow kernel
            return Timing(median_us=wall, bound="wall", events_median_us=gpu, wall_median_us=wall,
                          host_median_us=295.0)

    monkeypatch.setattr(tuning, "ScheduleTimer", HostBound)
    result = tune_schedule(TASK, HUMAN, PASSED, tune_plan("tune_cpu", "small", 60))
    assert result is not None and result.source is not None
    assert (pinned_schedule(result.source)
            == {**pinned_schedule(HUMAN), **{small_key(p): WINNER for p in TASK.shape("small")}})
    assert "tiny: 105.0 -> 50.0 us" in result.source and "(GPU time)" in result.source
    shape = result.search["tiny"]
    assert shape.gain == pytest.approx(2.1) and shape.calls[0].tried_us[config_label(WINNER)] == 50.0


def test_a_failed_tune_stage_is_an_error_with_its_reason():
    with pytest.raises(TuningFailed, match="static check"):
        tune_schedule(TASK, "import os\n", PASSED, tune_plan("tune_cpu", "small", 5))


# --- the H200 -------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_tuning_a_human_kernel_at_one_bench_shape_on_the_gpu():
    """QuACK compiles every proposal; the stage's own interleaved re-time decides, so the tuned schedule is
    never slower than the configs as written beyond noise."""
    point = min(TASK.shape("bench"), key=lambda p: TASK.flops(p.dims))
    plan = Plan(stages=["tune"], backend="quack", shape_set="bench", shape_names=[point.name],
                tune_budget_s=150, tune_cache=False, timeout=900)
    verdict = verify(TASK, HUMAN, plan)
    assert verdict.passed, verdict.reason
    shape = verdict.stage("tune").tuning[point.name]
    (call,) = shape.calls
    assert len(call.tried_us) > 2, call
    assert shape.after.median_us <= shape.before.median_us * 1.03
    table = tuning.tuned_table(verdict.stage("tune"))
    if table:
        pinned = pin_schedule(HUMAN, table)
        checked = verify(TASK, pinned, Plan(stages=["gpu_correctness"], backend="quack", shape_set="bench",
                                            shape_names=[point.name], seeds=[0], timeout=900))
        assert checked.passed, checked.reason


@pytest.mark.gpu
def test_a_misconfigured_human_kernel_is_tuned_back_to_within_3_percent_of_the_tuned_human_one():
    """gemm_residual with 64x64 tiles and no cluster (about 2.5x slower on the H200) and as written, each
    searched afresh at the narrow llama3-1b-down shape: the two tuned modules end within 3% of each other."""
    task = find_task("gemm_residual")
    human = task.human_file.read_text()
    # Without the kernel's pinned schedule, which outranks a call's config= (it pins this shape).
    slow = without_schedule(human).replace("import epilogue, gemm", "import Config, epilogue, gemm").replace(
        "C=residual)", "C=residual, config=Config(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1))")
    assert "tile_m=64" in slow and "schedule" not in slow and not check_source(slow)
    plan = Plan(stages=["tune"], backend="quack", shape_set="bench", shape_names=["llama3-1b-down"],
                tune_budget_s=90, tune_cache=False, timeout=900)
    tuned = {}
    for name, source in (("human", human), ("misconfigured", slow)):
        verdict = verify(task, source, plan)
        assert verdict.passed, verdict.reason
        tuned[name] = verdict.stage("tune").tuning["llama3-1b-down"]
    # the config was bad
    assert tuned["misconfigured"].before.median_us > 1.5 * tuned["human"].before.median_us
    assert tuned["misconfigured"].after.median_us <= 1.03 * tuned["human"].after.median_us


def test_the_search_checks_one_timed_round_per_proposal_and_the_full_protocol_every_round():
    point = TASK.shape("small")[0]
    ctx = Context(task=TASK, source=HUMAN, plan=Plan(), deadline=time.monotonic() + 120)
    plan = RepPlan(warmup=1, target_s=0.0, min_reps=3 * BATCH, max_reps=3 * BATCH)  # three rounds
    with ctx.runner("torch", "cpu") as client:
        timer = ShapeTimer(ctx, client, point, "cpu")
        fetches = []
        fetch = client.fetch
        client.fetch = lambda limit: fetches.append(limit) or fetch(limit)
        timer.time({"proposal": {}}, {}, plan, checked_rounds=1)
        assert len(fetches) == 1  # one round's outputs, drawn at random, and not the warm-up's
        fetches.clear()
        timer.time({"proposal": {}}, {}, plan)
        assert len(fetches) == 1 + 3  # the warm-up's estimate and every timed round
        timer.close()


class DyingTimer:
    """A ShapeTimer whose runner dies under the first proposal it is asked to time."""

    def __init__(self, dies):
        self.dies = dies

    def time(self, candidates, baselines, plan, checked_rounds=None):
        if self.dies:
            raise RunnerCrashed(
                "the runner process died (exit 134)\nterminate called after throwing an instance\n")
        return {"proposal": Timing(median_us=100.0)}


def test_a_proposal_that_kills_the_runner_fails_and_the_search_goes_on_with_a_fresh_one():
    started = []
    runner = SearchRunner(lambda: started.append(len(started)) or f"client {len(started)}")
    search = ScheduleTimer(DyingTimer(True), lambda: DyingTimer(False) if runner.restart() else None)
    with pytest.raises(Reject) as rej:
        search.measure({A: WINNER})
    assert (rej.value.outcome == Outcome.CRASH
            and "terminate called after throwing an instance" in rej.value.reason)
    assert (search.measure({A: WINNER}).median_us == 100.0 and runner.client == "client 2"
            and runner.restarts == 1)
    for _ in range(MAX_RESTARTS - 1):
        assert runner.restart()
    # a runner that keeps dying ends the stage
    assert not runner.restart() and len(started) == 1 + MAX_RESTARTS
    with pytest.raises(RunnerCrashed):  # no fresh timer to be had: the death is the stage's
        ScheduleTimer(DyingTimer(True)).measure({A: WINNER})


def test_a_runner_that_dies_for_good_ends_the_stage_and_keeps_what_the_search_measured(monkeypatch):
    """The last death under a proposal ends the tune stage. What it measured comes back with the failure: the
    shapes it finished, the calls of the shape it cut short, and the config that killed the runner among their
    failures."""
    small = [p.name for p in TASK.shape("small")]

    class DiesAtTheLastShape(Deterministic):
        def measure(self, table):  # a ScheduleTimer whose reopen has no restart left
            if self.timer.point.name == small[-1] and WINNER in table.values():
                raise RunnerCrashed("the runner process died (exit 134)\nwhat():  std::bad_variant_access\n")
            return super().measure(table)

    monkeypatch.setattr(tuning, "ScheduleTimer", DiesAtTheLastShape)
    with pytest.raises(TuningFailed) as failed:
        tune_schedule(TASK, HUMAN, PASSED, tune_plan("tune_cpu", "small", 60))
    reason = str(failed.value)
    assert (f"died under config {config_label(WINNER)} with no restart left: what():  std::bad_variant_access"
            in reason)
    searched = failed.value.searched
    assert searched.source is None and set(searched.search) == set(small[:-1]) and len(small) >= 2
    assert all(s.calls[0].tuned == WINNER for s in searched.search.values())
    (call,) = searched.cut_short[small[-1]]
    assert call.failed[config_label(WINNER)] == "crash: what():  std::bad_variant_access (no restart left)"
    assert "default" in call.tried_us and config_label(WINNER) not in call.tried_us and call.tuned is None


def test_the_budget_is_the_stages_wall_time_final_comparisons_included(monkeypatch):
    """A user who asks for a budget gets about that: the time left is split evenly over the shapes still to
    tune, each share holding the shape's search and its final comparison (1.5 s here, which the search keeps
    as its estimate), so the stage ends by the budget, its runner's start included; a shape whose comparison
    no longer fits is not searched."""
    # (the shape's deadline, when its search began); when each comparison ended (monotonic)
    searches, compares_ended = [], []

    def search(sites, timer, deadline, cache, signatures, ready=None, earlier=()):
        searches.append((deadline, time.monotonic()))
        time.sleep(max(0.0, deadline - 1.5 - time.monotonic()))  # its share to the end, less its estimate
        return {sites[0].key: WINNER}, [], Timing(median_us=120.0)

    class SlowCompare(Deterministic):
        def compare(self, table):
            time.sleep(1.5)  # a final comparison: the full repetition plan
            compares_ended.append(time.monotonic())
            return super().compare(table)

    monkeypatch.setattr(tuning, "search_shape", search)
    monkeypatch.setattr(tuning, "ScheduleTimer", SlowCompare)
    small = TASK.shape("small")
    budget = 12.0  # the sandboxed runner's start takes 1-5 s of it on a CPU
    plan = Plan(stages=["tune_cpu"], shape_set="small", tune_budget_s=budget, tune_cache=False)
    ctx = Context(task=TASK, source=HUMAN, plan=plan, deadline=time.monotonic() + 120)
    stage_end = time.monotonic() + budget
    result = tuning.run_tune(ctx, "tune_cpu", "torch", "cpu")
    assert result.outcome == Outcome.PASSED, result.reason
    assert compares_ended[-1] <= stage_end + 0.3  # the runner's start and the traced calls came out of it too
    assert result.seconds <= budget + 2.5  # and then the runner is stopped and its folder removed
    (first_end, first_began), *_ = searches
    # an even share, its comparison included
    assert first_end - first_began == pytest.approx((stage_end - first_began) / len(small), abs=0.3)
    compared, unreached = result.details["comparisons_s"], result.details["out_of_budget"]
    assert (small[0].name in compared
            and len(compared) + len(unreached) == len(small) == len(searches) + len(unreached))
    assert all(s == pytest.approx(1.5, abs=0.3) for s in compared.values())


def test_the_time_the_later_shapes_leave_goes_to_a_shape_whose_search_was_cut_short(monkeypatch):
    """On the H200 (2026-12-06-a) gemm_rmsnorm's first shape timed 16 of its 23 configs while the builds were
    under way, the four later shapes all 23 each from built kernels, and the stage ended at 27.9 s of 45 with
    7 configs untried. The shapes cut short now go on, in a second pass, with the time the others left."""
    searched = []  # (shape's M, the earlier calls it was given)

    def search(sites, timer, deadline, cache, signatures, ready=None, earlier=()):
        searched.append((timer.timer.point.dims["M"], list(earlier)))
        cut = len(searched) == 1  # the first shape's share ends before its space does
        call = TunedGemm(epilogue=sites[0].key[0], mnk=sites[0].mnk, mode=sites[0].mode,
                         tried_us={"default": 120.0}, seconds={"128x192 pingpong 2x1": {"proposal": 0.05}},
                         untried=3 if cut else 0)
        return {sites[0].key: WINNER}, [call], Timing(median_us=120.0)

    monkeypatch.setattr(tuning, "search_shape", search)
    monkeypatch.setattr(tuning, "ScheduleTimer", Deterministic)
    small = TASK.shape("small")
    plan = Plan(stages=["tune_cpu"], shape_set="small", tune_budget_s=30.0, tune_cache=False)
    ctx = Context(task=TASK, source=HUMAN, plan=plan, deadline=time.monotonic() + 120)
    result = tuning.run_tune(ctx, "tune_cpu", "torch", "cpu")
    assert result.outcome == Outcome.PASSED, result.reason
    first = small[0]
    assert len(searched) == len(small) + 1 and result.details["resumed"] == [first.name]
    (m, earlier), *_, (m_again, earlier_again) = searched
    assert m == m_again == first.dims["M"] and earlier == [] and earlier_again[0].untried == 3
    assert result.details["configs_untried"] == 0  # the second search's record replaces the first's
    assert result.seconds < 30.0


def test_no_second_search_starts_where_its_comparison_and_proposals_no_longer_fit():
    shape = ShapeTuning(dims={}, before=Timing(median_us=1.0), after=Timing(median_us=1.0), calls=[
        TunedGemm(epilogue="e", mnk=(1, 1, 1), mode="element", untried=2,
                  seconds={"a": {"proposal": 0.5}, "b": {"proposal": 1.5}})])
    assert tuning.resume_cost(shape, {"s": 2.0, "t": 4.0}) == pytest.approx(3.0 + 4 * 1.0)
    shape.calls[0].seconds = {}
    assert tuning.resume_cost(shape, {"s": 2.0}) == pytest.approx(2.0 + 4 * 2.0)  # a comparison a proposal
    assert tuning.resume_cost(shape, {}) == float("inf")  # nothing to go by: no second search


def test_the_search_keeps_time_for_its_comparison_by_what_forward_as_written_cost():
    """The comparison's cost follows from the search's first measure: at the 256k-vocabulary head (H200,
    2026-12-05) that measure took about 23 ms a call and 2.5 s to fetch and check one round, and the final
    comparison then took 14.4 s, where the stage had kept a quarter of its time left, 8.6 s, and overran.
    Where outputs are small, the estimate is a few seconds and the search keeps the rest."""
    head = {"timed: traced": 0.12, "timed: candidate": 0.115, "timed: transfer": 2.2, "timed: checks": 0.3}
    assert tuning.comparison_estimate(Timing(median_us=22348.6, reps=5), head) == pytest.approx(14.4, rel=0.1)
    small = {"timed: traced": 0.01, "timed: candidate": 0.01, "timed: transfer": 0.2, "timed: checks": 0.02}
    assert tuning.comparison_estimate(Timing(median_us=1200.0, reps=20), small) < 2.0
    assert tuning.comparison_estimate(Timing(median_us=100.0), {}) == 0.0  # nothing measured: nothing kept

    class HeadTimer(FakeTimer):  # the head's measure: 22 ms calls, 5 reps, its parts as above
        def measure(self, table):
            return super().measure(table).model_copy(update={"median_us": 22348.6, "reps": 5})

    timer = HeadTimer(rule)
    timer.seconds = head
    _, calls, _ = search_shape(SITES, timer, deadline=17.0, cache=TuneCache(None, "H200"), signatures={},
                               clock=timer.clock)
    # 1 s a measure: forward() as written, then one proposal a call before 17 - 14.5 s
    assert len(timer.asked) == 3 and all(c.untried > 0 for c in calls)


def test_the_builds_run_beside_the_searches_which_wait_only_for_the_configs_they_propose(monkeypatch):
    """At the H200 the builds of a shape's 36 configs, made before its search, took the whole of a 45 s budget
    and the search timed one config (2026-12-05). Now the builders start with the stage, each shape queues its
    proposals, its search gets an even share of the budget at once (waiting in ``ready`` for each proposal's
    build), what it did not reach is dropped, and the stage ends every builder."""
    events, searches = [], []  # what the builders were asked, in order; (share's end, when it began)

    counts = {"queued": 0, "built": 0, "failed": 0, "skipped": 0}

    class FakeBuilds:
        def __init__(self):
            self.counts = counts

        def start(self):
            events.append("start")

        def add(self, builds):
            events.append(("add", len(builds)))
            return len(builds)

        def wait(self, build, until):
            return None

        def skip(self):
            events.append("skip")

        def close(self):
            events.append("close")

    def search(sites, timer, deadline, cache, signatures, ready=None, earlier=()):
        assert ready is not None and ready(("x", None), deadline) is None
        searches.append((deadline, time.monotonic()))
        return {sites[0].key: WINNER}, [], Timing(median_us=120.0)

    monkeypatch.setattr(tuning, "search_shape", search)
    monkeypatch.setattr(tuning, "ScheduleTimer", Deterministic)
    shapes, budget = len(TASK.shape("small")), 60.0
    plan = Plan(stages=["tune_cpu"], shape_set="small", tune_budget_s=budget, tune_cache=False)
    ctx = Context(task=TASK, source=HUMAN, plan=plan, deadline=time.monotonic() + 120)
    stage_end = time.monotonic() + budget
    result = tuning.run_tune(ctx, "tune_cpu", "torch", "cpu", start_builders=lambda c, deadline: FakeBuilds())
    assert result.outcome == Outcome.PASSED, result.reason
    assert len(searches) == shapes >= 2
    assert events[0] == "start" and events[-1] == "close"
    assert [e for e in events[1:-1] if e == "skip"] == ["skip"] * shapes  # each search's leftovers dropped
    assert all(isinstance(e, tuple) and e[1] > 0 for e in events[1:-1] if e != "skip")
    (search_end, search_began), *_ = searches  # an even share, its comparison included
    assert search_end - search_began == pytest.approx((stage_end - search_began) / shapes, abs=0.2)
    assert result.details["builds"] == counts
