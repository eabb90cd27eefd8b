"""The ``tune`` stage: the harness owns the schedule of a correct candidate (issue 10).

At each shape of the plan, one traced call tells the checker which gemm calls forward() makes (epilogue,
M, N, K, mode, the config each ran with; the runner's op log). Then a coordinate descent, one gemm call
at a time: every config of :func:`~coda_agent.primitives.configs.config_space` valid for the call's mode
(default first, then by the wave model), then the fastest at the tile scheduler's other swizzle groups
(:data:`~coda_agent.primitives.configs.SWIZZLE_GROUPS`, kept only :data:`MIN_GAIN` faster), is set as the
harness's schedule in the runner and forward() is timed whole, candidate only, by the checker's honest
protocol (:class:`~.gpu.ShapeTimer`, fewer reps, one round's outputs checked); the fastest by the GPU's time
(the CUDA events: a config changes only the kernels, and a host-bound forward() would hide that behind its
host time) stays for the next call.
On the GPU, the configs a shape's search will propose are built for sm_90a by CPU processes side by side
(:mod:`.builds`) while the search times the ones built already, in the order it proposes them: a proposal
loads its kernels instead of building them, and a config whose build fails or aborts is recorded as failed
without being proposed. Once a shape's search ends, the builds it did not reach are dropped.
The plan's budget is the stage's wall time: the runner's start-up, each shape's traced call, the searches
(waits for builds included) and the final comparisons all come out of it. The time left is split evenly over
the shapes still to tune, each share holding the shape's search and its final comparison (what one leaves over
goes to the next); once forward() as written is measured, the search ends early enough for the comparison
(:func:`comparison_estimate`: that measure's cost per call and per checked round, at the comparison's reps and
checks), and at a shape its time is split over the gemm calls still to search; a proposal under way finishes,
so the stage ends by its budget plus at most one proposal (and a comparison that outran its estimate). A shape
whose final comparison no longer fits (the ones measured so far, on average) is not searched
(``details["out_of_budget"]``). Finally forward() as written and under the tuned schedule are timed
interleaved with the full repetition plan, :data:`FINAL_CHECKS` rounds of each checked. After the last shape,
the shapes whose search its share cut short (the first, mostly, while the builds were under way) are searched
again, in a second pass with what the later shapes left over: from the schedule each chose, proposing only the
configs it had not reached, and compared again, while one's comparison and four of its proposals still fit
(:func:`resume_cost`; ``details["resumed"]``). A config that fails
(raises, launches something else, computes a wrong result, kills the runner) is recorded and skipped; a dead
runner is started again, at most :data:`MAX_RESTARTS` times in a stage (the next death ends it, and the
candidate keeps its configs; what that shape's search had measured, the config that killed it included, stays
in ``details["cut_short"]``). A death outside a proposal (the shape's traced call, its final comparison) loses
that shape only (``details["shapes_lost"]``).

A finished search is cached by (epilogue signature: name + hash of its source, M, N, K, device, package
versions) in ``settings.cache_dir()/tuned_configs.json``, so an unchanged epilogue is not searched twice.

The winners reach the exported module as ``@schedule({...})`` on forward
(:func:`~.static.schedule_source.pin_schedule`), the one decorator form the static check accepts besides
``@epilogue``. ``tune`` runs on the GPU through QuACK; ``tune_cpu`` runs the same path on the emulator, where
configs are accepted and ignored and the times are the host's (for tests).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import torch

from ..atomic import write_text_atomic
from ..measure.timing import BATCH, RepPlan, Timing
from ..primitives import Config
from ..primitives._config import Major, Mode
from ..primitives._schedule import ScheduleKey
from ..primitives.configs import (
    SWIZZLE_GROUPS,
    Schedule,
    config_fields,
    config_from_fields,
    config_label,
    config_space,
    swizzled,
)
from ..provenance import package_versions
from ..settings import cache_dir
from ..tasks.model import ShapePoint
from .builds import BUILDERS, Build, Builds
from .client import RunnerClient, RunnerCrashed, RunnerError, last_line
from .gpu import ShapeTimer
from .stages import Context, Reject, Stopwatch, runner_failure, stage
from .static.schedule_source import without_schedule
from .verdict import MIN_GAIN, Outcome, ShapeTuning, StageResult, TunedGemm

#: Repetitions per proposal: enough to rank configs; the final before/after comparison uses the full plan.
SEARCH_REPS = RepPlan(warmup=2, target_s=0.05, min_reps=5, max_reps=20)
#: Timed rounds per proposal whose outputs are checked. On the H200 fetching them was 70-85% of a proposal's
#: timed rounds at the block's shapes (1.2-2.3 of 1.5-2.6 s; h200-2026-12-02-i-tune-human-1.json); one round
#: still rejects a config that computes wrong, and the schedule the search picks is timed again under the full
#: checks.
SEARCH_CHECKS = 1
FINAL_REPS = RepPlan()
#: Rounds per variant whose outputs the final comparison checks: the timing is the full plan's, but a pinned
#: schedule is verified again whole before it is adopted (``Agent._tune``), so a config that computes wrong
#: still fails there; checking every round cost the 256k-vocabulary head 2 s of output transfer a round
#: (accept, 2026-12-03).
FINAL_CHECKS = 2
CACHE_FILE = "tuned_configs.json"
MODES: tuple[Mode, ...] = ("element", "acc_pair", "packed")
#: Runner deaths a stage outlives (each starts a fresh runner; one more ends the stage).
MAX_RESTARTS = 2


@dataclass(frozen=True)
class GemmSite:
    """One distinct gemm call of forward() at one shape, as the runner's op log reported it."""

    key: ScheduleKey
    mode: Mode
    has_outputs: bool
    written: Config | None
    store_d: bool = True
    b_major: Major = "k"
    reads_tiles: bool = False
    #: what every tile's N must be a multiple of (a HeadRstd's head lies within one tile)
    tile_n_multiple: int = 1

    @property
    def mnk(self) -> tuple[int, int, int]:
        return self.key[1], self.key[2], self.key[3]

    def space(self) -> list[Config]:
        """The configs to search for this call (:func:`~coda_agent.primitives.configs.config_space`)."""
        return [c for c in config_space(self.mode, self.has_outputs, self.mnk, self.store_d,
                                        b_major=self.b_major, reads_tiles=self.reads_tiles)
                if c.tile_n % self.tile_n_multiple == 0]

    @property
    def effective(self) -> Config:
        """The config it runs as written (None in the log runs QuACK's SM90 default, which is Config())."""
        return self.written or Config()


def gemm_sites(ops: Sequence[Mapping[str, Any]]) -> list[GemmSite]:
    """The distinct gemm calls of one call's op log, in call order (the runner's words: validated, not
    trusted)."""
    sites: dict[ScheduleKey, GemmSite] = {}
    for op in ops:
        dims, name, mode = op.get("gemm"), op.get("epilogue"), op.get("mode")
        if not (isinstance(dims, list) and len(dims) == 3 and all(type(d) is int and d > 0 for d in dims)):
            continue
        if not isinstance(name, str) or len(name) > 200 or mode not in MODES:
            continue
        try:
            written = config_from_fields(op["config"]) if op.get("config") is not None else None
        except ValueError:
            written = None
        key = (name, dims[0], dims[1], dims[2])
        multiple = op.get("tile_n_multiple")
        sites.setdefault(key, GemmSite(key, cast(Mode, mode), bool(op.get("outputs")), written,
                                       op.get("store_d") is not False, "n" if op.get("b_major") == "n"
                                       else "k", op.get("reads_tiles") is True,
                                       multiple if type(multiple) is int and 1 <= multiple <= 256 else 1))
    return list(sites.values())


def epilogue_signature(source: str, name: str) -> str:
    """``name:<hash>`` of the whole module without its pinned schedule: the kernel of an epilogue depends on
    the helpers and constants its fn calls too, so only the same code (whatever it pins) shares a finished
    search."""
    return f"{name}:{hashlib.sha256(without_schedule(source).encode()).hexdigest()[:16]}"


class TuneCache:
    """Finished searches by (epilogue signature, M, N, K, device, package versions); ``path`` None: memory
    only."""

    def __init__(self, path: Path | None, device: str) -> None:
        self.path, self.device = path, device
        self.versions = package_versions()
        self.entries: dict[str, dict[str, Any]] = self._read() if path is not None else {}
        self._new: dict[str, dict[str, Any]] = {}

    def _read(self) -> dict[str, dict[str, Any]]:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        entries = data.get("entries") if isinstance(data, dict) else None
        return entries if isinstance(entries, dict) else {}

    def _key(self, signature: str, mnk: tuple[int, int, int]) -> str:
        return json.dumps([signature, list(mnk), self.device, self.versions], sort_keys=True)

    def get(self, signature: str, mnk: tuple[int, int, int]) -> Config | None:
        entry = self.entries.get(self._key(signature, mnk))
        try:
            return config_from_fields(entry.get("config")) if isinstance(entry, dict) else None
        except ValueError:
            return None

    def put(self, signature: str, mnk: tuple[int, int, int], config: Config, result: TunedGemm) -> None:
        entry = {
            "config": config_fields(config), "tried_us": result.tried_us, "epilogue": signature,
            "mnk": list(mnk), "device": self.device,
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        self.entries[self._key(signature, mnk)] = self._new[self._key(signature, mnk)] = entry

    def save(self) -> None:
        """Add this run's entries to the file as it is now (another process may have added its own)."""
        if self.path is None or not self._new:
            return
        merged = {**self._read(), **self._new}
        write_text_atomic(self.path, json.dumps({"version": 1, "entries": merged}, indent=1, sort_keys=True))
        self._new.clear()


class SearchRunner:
    """The search's runner process, one for every shape, started again when it dies: at most
    :data:`MAX_RESTARTS` times, so a candidate that dies on purpose spends only its own budget."""

    def __init__(self, start: Callable[[], RunnerClient]) -> None:
        self.start, self.restarts = start, 0
        self.client = start()

    def restart(self) -> bool:
        if self.restarts >= MAX_RESTARTS:
            return False
        self.restarts += 1
        self.client = self.start()
        return True


class ScheduleTimer:
    """How the search measures a schedule: forward() whole at one shape, through the checker's timing
    protocol.

    A proposal that kills the runner fails like one that raises, when ``reopen`` gives a timer on a fresh
    runner (None: it cannot, and the death ends the stage). The seam of the search (tests put a deterministic
    one in its place).
    """

    def __init__(self, timer: ShapeTimer, reopen: Callable[[], ShapeTimer | None] = lambda: None) -> None:
        self.timer, self.reopen = timer, reopen

    def measure(self, table: Schedule) -> Timing:
        try:
            return self.timer.time({"proposal": table}, {}, SEARCH_REPS,
                                   checked_rounds=SEARCH_CHECKS)["proposal"]
        except RunnerCrashed as exc:
            timer = self.reopen()
            if timer is None:
                raise
            self.timer = timer
            raise RunnerRestarted(Outcome.CRASH,
                                  f"the runner died under it (restarted): {last_line(exc)}") from None

    @property
    def seconds(self) -> dict[str, float]:
        """Where the last measurement's wall clock went (its warm-up holds the build of a new config's
        kernels)."""
        return self.timer.seconds

    def compare(self, table: Schedule) -> tuple[Timing, Timing]:
        """(as written, under ``table``), timed interleaved."""
        t = self.timer.time({"as_written": {}, "tuned": table}, {}, FINAL_REPS, checked_rounds=FINAL_CHECKS)
        return t["as_written"], t["tuned"]


class RunnerRestarted(Reject):
    """A measurement the runner died under; a fresh one has taken its place (a proposal's: that config
    failed)."""


class SearchCut(RunnerCrashed):
    """The runner died under a proposal with no restart left: the stage ends, and ``calls`` is what the search
    at that shape had measured (the fatal config among its failures)."""

    def __init__(self, crash: RunnerCrashed, label: str, calls: list[TunedGemm]) -> None:
        super().__init__(f"the runner died under config {label} with no restart left: {last_line(crash)}")
        self.calls = calls


def search_shape(
    sites: Sequence[GemmSite], timer: ScheduleTimer, deadline: float, cache: TuneCache,
    signatures: Mapping[str, str], clock: Callable[[], float] = time.monotonic,
    ready: Callable[[Build, float], str | None] = lambda build, until: None,
    earlier: Sequence[TunedGemm] = (),
) -> tuple[dict[ScheduleKey, Config], list[TunedGemm], Timing]:
    """Coordinate descent over the calls at one shape: (the harness schedule found, per call what happened,
    the time of forward() as written). ``deadline`` is when the shape's final comparison is to be done too:
    the search keeps :func:`comparison_estimate` of it. Each call gets an equal share of the search's time
    left when its turn comes (a block's second GEMM is searched too when forward() is slow); a call whose
    search its share cut short is not cached. Before each proposal ``ready`` waits for its build
    (:meth:`.builds.Builds.wait`) until the call's share ends; a config whose build failed is recorded as
    failed and never proposed. ``earlier`` is this shape's calls as a search its budget cut short left them
    (:func:`run_tune`'s second pass): the search goes on from what they chose, measured again, and proposes
    only the configs they did not reach."""
    written = timer.measure({})
    deadline -= comparison_estimate(written, timer.seconds)
    before = {(e.epilogue, e.mnk): e for e in earlier}
    chosen: dict[ScheduleKey, Config] = {}
    for site in sites:
        found = before.get((site.key[0], site.mnk))
        if found is not None and found.tuned is not None:
            chosen[site.key] = found.tuned
    best = timer.measure(chosen).gpu_us if chosen else written.gpu_us
    results = []
    for i, site in enumerate(sites):
        share = clock() + max(0.0, deadline - clock()) / (len(sites) - i)
        found = before.get((site.key[0], site.mnk))
        if found is not None:
            result = found.model_copy(deep=True, update={"untried": 0})
            results.append(result)
            if not found.untried:  # its search had finished
                continue
        else:
            result = TunedGemm(epilogue=site.key[0], mnk=site.mnk, mode=site.mode, written=site.written)
            results.append(result)
            result.tried_us[config_label(site.written)] = best
        effective = site.effective
        signature = signatures.get(site.key[0], site.key[0])
        cached = cache.get(signature, site.mnk)
        if cached is not None:
            result.cached = True
            if cached != effective:
                chosen[site.key] = result.tuned = cached
            continue
        complete, refined = True, False
        reached = {*result.tried_us, *result.failed} if found is not None else set()  # by label, as recorded
        queue = deque(c for c in site.space() if c != effective and config_label(c) not in reached)
        while queue or not refined:
            if not queue:  # the tiles searched, the fastest's swizzle groups (a runtime value: no build)
                refined = True
                queue.extend(c for c in swizzled(chosen.get(site.key, effective))
                             if c != effective and config_label(c) not in reached)
                continue
            config = queue.popleft()
            unbuilt = ready((site.key[0], config), share) if clock() < share else None
            if clock() >= share:
                complete = False
                result.untried = len(queue) + 1 + (0 if refined else len(SWIZZLE_GROUPS) - 1)
                break
            label = config_label(config)
            if unbuilt is not None:
                result.failed[label] = f"{Outcome.COMPILE_ERROR.value}: {unbuilt}"
                continue
            started = clock()
            try:
                us = timer.measure({**chosen, site.key: config}).gpu_us
            except Reject as rej:
                result.failed[label] = f"{rej.outcome.value}: {last_line(rej)}"
                result.seconds[label] = {"proposal": round(clock() - started, 2)}
                continue
            except RunnerCrashed as exc:  # and no runner to go on with
                result.failed[label] = f"{Outcome.CRASH.value}: {last_line(exc)} (no restart left)"
                result.seconds[label] = {"proposal": round(clock() - started, 2)}
                raise SearchCut(exc, label, results) from None
            parts = {"proposal": clock() - started, **timer.seconds}
            result.seconds[label] = {k: round(v, 2) for k, v in parts.items()}
            result.tried_us[label] = us
            if us * (MIN_GAIN if refined else 1.0) < best:  # another swizzle group by a margin, not by noise
                best, chosen[site.key], result.tuned = us, config, config
        if complete:
            cache.put(signature, site.mnk, chosen.get(site.key, effective), result)
    return chosen, results, written


#: What starts a stage's builders with their deadline (monotonic): :func:`start_builds` on the GPU.
StartBuilds = Callable[[Context, float], Builds]


def run_tune(ctx: Context, name: str, backend_name: str, device: str,
             start_builders: StartBuilds | None = None) -> StageResult:
    """The stage (module docstring) on one backend and device; ``start_builders`` builds the proposals beside
    the search."""
    t0 = time.perf_counter()
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    cache = TuneCache(cache_dir() / CACHE_FILE if ctx.plan.tune_cache else None, device_name)
    tuning: dict[str, ShapeTuning] = {}
    details: dict[str, object] = {"device": device_name, "budget_s": ctx.plan.tune_budget_s}

    def result(outcome: Outcome, reason: str) -> StageResult:
        details["configs_tried"] = sum(len(c.tried_us) - 1
                                       + len(c.failed) for s in tuning.values() for c in s.calls)
        details["configs_untried"] = sum(c.untried for s in tuning.values() for c in s.calls)
        return StageResult(stage=name, outcome=outcome, reason=reason, seconds=time.perf_counter() - t0,
                           tuning=tuning, details=details)

    points = ctx.plan.points(ctx.task)
    lost: dict[str, str] = {}  # shape -> why: the runner died there outside a proposal and was started again
    details["shapes_lost"] = lost
    deadline = time.monotonic() + ctx.plan.tune_budget_s  # the stage's wall time (module docstring)
    # shape -> its final comparison's seconds: what the later shapes keep for theirs
    compared: dict[str, float] = {}
    details["comparisons_s"] = compared
    unreached: list[str] = []  # shapes the budget ended before
    details["out_of_budget"] = unreached
    resumed: list[str] = []  # shapes searched again with what the others left over
    details["resumed"] = resumed
    builds = start_builders(ctx, deadline) if start_builders is not None else None
    if builds is not None:
        builds.start()  # their runners start beside the search's
        details["builds"] = builds.counts  # queued, built, failed, skipped: the builders' work in all
    try:
        with ExitStack() as stack:
            if builds is not None:
                stack.callback(builds.close)
            runner = SearchRunner(lambda: stack.enter_context(ctx.runner(backend_name, device)))

            def tune_at(point: ShapePoint, shapes_left: int, earlier: Sequence[TunedGemm] = ()) -> str | None:
                """One shape's traced call, search and final comparison, in an even share of the time left;
                None, or why the shape was lost (the runner died outside a proposal and was started again)."""
                try:
                    with ctx.watch.part("traced call"):  # its input sets made and sent with it
                        timer = ShapeTimer(ctx, runner.client, point, device)
                        # traced: which gemm calls there are to tune
                        batch = runner.client.run([timer.ids[0]], keep=[])
                    sites = gemm_sites((batch.ops or [[]])[0])
                    signatures = {s.key[0]: epilogue_signature(ctx.source, s.key[0]) for s in sites}

                    def reopen(at: ShapePoint = point) -> ShapeTimer | None:
                        return ShapeTimer(ctx, runner.client, at, device) if runner.restart() else None

                    search = ScheduleTimer(timer, reopen)
                    if builds is not None:  # a kernel does not depend on sizes: earlier shapes' builds serve
                        builds.add(proposals(sites, signatures, cache))
                    now = time.monotonic()  # an even share of what is left, the shape's comparison included
                    share = now + max(0.0, deadline - now) / shapes_left
                    try:
                        with ctx.watch.part("search"):
                            chosen, calls, written = search_shape(
                                sites, search, share, cache, signatures,
                                ready=builds.wait if builds is not None else lambda build, until: None,
                                earlier=earlier)
                    finally:
                        if builds is not None:
                            builds.skip()  # what this search did not reach: a later shape queues it again
                    compare_started = time.monotonic()
                    with ctx.watch.part("comparison"):
                        before, after = search.compare(chosen) if chosen else (written, written)
                    if chosen:
                        compared[point.name] = round(time.monotonic() - compare_started, 2)
                    with ctx.watch.part("close"):
                        search.timer.close()
                except SearchCut as cut:  # the stage ends (below); what this shape's search measured stays
                    details["cut_short"] = {point.name: [c.model_dump(mode="json") for c in cut.calls]}
                    raise
                except RunnerRestarted as exc:  # under forward() as written, which the search measures first
                    return exc.reason
                # outside a measurement (the shape's traced call, its final comparison)
                except RunnerCrashed as exc:
                    if not runner.restart():
                        raise
                    return f"the runner died (restarted): {last_line(exc)}"
                tuning[point.name] = ShapeTuning(dims=point.dims, before=before, after=after, calls=calls)
                return None

            try:
                for i, point in enumerate(points):
                    if compared and deadline - time.monotonic() < statistics.mean(compared.values()):
                        # not even its final comparison fits: the stage ends by its budget
                        unreached.append(point.name)
                        continue
                    why = tune_at(point, len(points) - i)
                    if why is not None:
                        lost[point.name] = why
                # A second pass: the shapes whose search the budget cut short (the first, mostly, while the
                # builds were still under way) go on with what the others left over, as long as a search and
                # a comparison still fit.
                again = [p for p in points
                         if p.name in tuning and any(c.untried for c in tuning[p.name].calls)]
                for i, point in enumerate(again):
                    if deadline - time.monotonic() < resume_cost(tuning[point.name], compared):
                        break
                    resumed.append(point.name)
                    tune_at(point, len(again) - i, earlier=tuning[point.name].calls)  # lost: the first stays
            except Reject as rej:
                return result(rej.outcome, rej.reason)
        details["runner_restarts"] = runner.restarts
    except RunnerError as exc:
        return result(*runner_failure(exc, ctx.plan, Outcome.RUNTIME_ERROR, "tuning failed:\n"))
    finally:
        cache.save()
    summary = "; ".join(f"{s}: {t.before.gpu_us:.1f} -> {t.after.gpu_us:.1f} µs" for s, t in tuning.items())
    summary += "".join(f"; {s}: not tuned, {why}" for s, why in lost.items())
    summary += "".join(f"; {s}: not tuned, the budget ended before it" for s in unreached)
    return result(Outcome.PASSED, f"tuned (GPU time: {summary})")


def resume_cost(shape: ShapeTuning, compared: Mapping[str, float]) -> float:
    """The least time a second search at ``shape`` is worth starting in: its comparison (the stage's so far,
    on average), and four of its first search's proposals (forward() as written and the schedule it chose,
    measured again, then two new configs), each at least a comparison's where it made none; never, where
    nothing was measured to go by."""
    proposals = [s["proposal"] for c in shape.calls for s in c.seconds.values() if "proposal" in s]
    comparison = statistics.mean(compared.values()) if compared else None
    proposal = statistics.median(proposals) if proposals else comparison
    if proposal is None:
        return math.inf
    return (comparison or 0.0) + 4 * proposal


def comparison_estimate(written: Timing, seconds: Mapping[str, float]) -> float:
    """Seconds a shape's final comparison will take, from the search's measure of forward() as written
    (``written``, and ``seconds``, where that measure's time went): both variants' calls (warm-up, sizing, a
    traced and a timed batch a round, at the full plan's reps) at its cost per call, and :data:`FINAL_CHECKS`
    checked rounds of each at its cost per checked round. The cost of a check dominates where outputs are
    large: at the 256k-vocabulary head a round's 4.2 GB of logits took 2.1-2.3 s to fetch, its calls 22 ms
    each, and the comparison 14.4 s where a quarter of the time left, 8.6 s, had been kept (H200,
    2026-12-05)."""
    calls = 2 * max(written.reps, 1)  # a traced and a timed batch a round
    per_call = (seconds.get("timed: traced", 0.0) + seconds.get("timed: candidate", 0.0)) / calls
    per_check = (seconds.get("timed: transfer", 0.0) + seconds.get("timed: checks", 0.0)) / SEARCH_CHECKS
    planned = FINAL_REPS.reps_for(written.gpu_us)
    size = min(BATCH, planned)
    reps = -(-planned // size) * size  # whole batches
    return 2 * (per_call * (2 * reps + FINAL_REPS.warmup + 3) + FINAL_CHECKS * per_check)


def proposals(sites: Sequence[GemmSite], signatures: Mapping[str, str], cache: TuneCache) -> list[Build]:
    """What the searches of ``sites`` will propose, in their order: every config of each call's space that is
    not its config as written (the GPU runner builds that one: it times it first) at a call not cached."""
    return [(s.key[0], c) for s in sites if cache.get(signatures[s.key[0]], s.mnk) is None
            for c in s.space() if c != s.effective]


def start_builds(ctx: Context, deadline: float) -> Builds:
    """Builders for sm_90a on the CPU (:mod:`.builds`), each a compile-only runner of the candidate with the
    first small shape's inputs, until ``deadline``. They work beside the search, so their runners' time is not
    among the stage's parts (the builds' counts are in its details)."""
    small = ctx.task.shape("small")

    @contextmanager
    def compile_runner() -> Iterator[RunnerClient]:
        with ctx.runner("quack-compile", "cpu", deadline, watch=Stopwatch()) as client:
            client.put("build", ctx.task.make_inputs(small[0].dims, 0))
            yield client

    return Builds(compile_runner, deadline, workers=BUILDERS if small else 0)


@stage("tune")
def tune(ctx: Context) -> StageResult:
    """The schedule search with real QuACK kernels on the GPU."""
    if not torch.cuda.is_available():
        return StageResult(stage="tune", outcome=Outcome.INFRA_ERROR, reason="no CUDA GPU on this machine")
    return run_tune(ctx, "tune", "quack", "cuda", start_builders=start_builds)


@stage("tune_cpu")
def tune_cpu(ctx: Context) -> StageResult:
    """The same search on the emulator (configs are accepted and ignored; host times): the path, tested on a
    CPU."""
    return run_tune(ctx, "tune_cpu", "torch", "cpu")


def tuned_table(result: StageResult, min_gain: float = MIN_GAIN) -> dict[ScheduleKey, Config]:
    """The configs to pin: every tuned call at the shapes where the tuned schedule won by ``min_gain``."""
    table: dict[ScheduleKey, Config] = {}
    for shape in result.tuning.values():
        if shape.kept(min_gain):
            for call in shape.calls:
                if call.tuned is not None:
                    table[(call.epilogue, *call.mnk)] = call.tuned
    return table
