"""GPU stages of the verifier: ``gpu_correctness``, ``profile``, ``bench`` and ``bench_prepare``.

Importable without a GPU (the protocol is tested on the CPU with the emulator and the host clock).

``gpu_correctness`` is the correctness protocol of :mod:`.stages` with real QuACK kernels, plus the kernel
trace of every call (launch budget, no cuBLAS, nothing on a side stream, a QuACK kernel per task GEMM).

``profile`` / ``bench`` time the candidate in its runner against the baselines in the checker, batch by
batch in rotating order. The candidate's calls cycle through fresh input sets drawn for this stage only;
one random call of every timed batch is checked against the FP32 reference. Each candidate turn is two batches
that forward() cannot tell apart, in a random order: one under the kernel trace and op log (every call's
kernels must match the checked calls'; neither its times nor its outputs are used), and one timed without them
(no profiler overhead). So a forward() that counts calls cannot know which ones are timed but not traced (a
cached answer copied out without a GEMM there would be caught in the traced batch as often as not, turn after
turn). A call's time is its CUDA events (recorded by the runner's harness), cross-checked against the
checker's own wall clock of the batch per call (less that of a dry batch, which does all but call forward):
when the events claim more than 10% + 20 µs less, the wall clock is reported instead.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from ..measure.baselines import baseline_variants
from ..measure.timing import BATCH, HOST_BOUND_SHARE, Clock, RepPlan, Timing, summarize
from ..primitives.configs import Schedule
from ..tasks.model import ShapePoint
from .client import CandidateRaised, RunnerClient, RunnerError
from .plan import PROFILE_COMPILE_MODES, TIMING_REFS_BYTES, TIMING_SETS
from .stages import (
    Context,
    Reject,
    call_problems,
    references,
    release,
    returned_bytes_limit,
    returned_checks,
    run_correctness,
    runner_failure,
    stage,
)
from .verdict import Outcome, ShapeTiming, StageResult

TIMING_METHOD = (
    "candidate in its sandboxed runner, baselines in the checker, batches of 5 calls interleaved in rotating "
    "order, each opened by a ~1 ms device sleep so the host runs ahead; each candidate turn is a traced "
    "batch (kernels judged) and an untraced timed one, in a random order; per call an L2 flush (256 MiB "
    "memset) then CUDA events on the caller's stream; candidate calls rotate over 3 fresh input sets, one "
    "random call per timed batch is checked; a call's time is its events, or the checker's wall clock per "
    "call (less a dry batch's) when that is over 10% + 20 µs more; the runner's host time around each "
    f"forward() is kept beside it (host-bound at {HOST_BOUND_SHARE:.0%} of the median or more); "
    f"{RepPlan().warmup} untraced warm-up calls, reps sized for ~{RepPlan().target_s} s per variant "
    f"({RepPlan().min_reps}-{RepPlan().max_reps}: at least {RepPlan().min_reps // BATCH} rounds); "
    "median with p10/p90"
)


@stage("gpu_correctness")
def gpu_correctness(ctx: Context) -> StageResult:
    """Real QuACK kernels on the GPU against the FP32 reference, with the kernel-trace rules."""
    if not torch.cuda.is_available():
        return StageResult(stage="gpu_correctness", outcome=Outcome.INFRA_ERROR,
                           reason="no CUDA GPU on this machine")
    torch.backends.cuda.matmul.allow_tf32 = False  # the FP32 reference must be FP32
    torch.backends.cudnn.allow_tf32 = False
    return run_correctness(ctx, "gpu_correctness", "quack", "cuda")


@stage("profile")
def profile(ctx: Context) -> StageResult:
    """The candidate's time at each shape, interleaved with eager PyTorch, torch.compile and cuBLAS alone.

    Inductor compiles the reference once per shape in the checker (its cache serves later candidates)."""
    if not torch.cuda.is_available():
        return StageResult(stage="profile", outcome=Outcome.INFRA_ERROR, reason="no CUDA GPU on this machine")
    return run_timing(ctx, compile_modes=PROFILE_COMPILE_MODES)


@stage("bench")
def bench(ctx: Context) -> StageResult:
    """As ``profile``, plus torch.compile of the reference in the plan's modes (``bench_prepare`` warms their
    cache)."""
    if not torch.cuda.is_available():
        return StageResult(stage="bench", outcome=Outcome.INFRA_ERROR, reason="no CUDA GPU on this machine")
    return run_timing(ctx, compile_modes=ctx.plan.compile_modes, name="bench")


@stage("bench_prepare")
def bench_prepare(ctx: Context) -> StageResult:
    """Build and run every baseline at every shape once (Inductor's compiles of the plan's modes, the GEMMs'
    layouts cuBLAS is given), so a later timing in this process finds them made: the timed ``bench`` run, or
    the first candidate's ``profile`` in an agent run of a task with no human kernel to time first. Nothing of
    the candidate is loaded."""
    t0 = time.perf_counter()
    for point in ctx.plan.points(ctx.task):
        inputs = ctx.task.make_inputs(point.dims, ctx.plan.seeds[0], device="cuda")
        variants = baseline_variants(ctx.task, point.dims, inputs, compile_modes=ctx.plan.compile_modes)
        with torch.no_grad():
            for fn in variants.values():
                fn()
        torch.cuda.synchronize()
        del inputs, variants
        release("cuda")
    return StageResult(stage="bench_prepare", outcome=Outcome.PASSED, seconds=time.perf_counter() - t0,
                       reason="")


def run_timing(ctx: Context, compile_modes: Sequence[str] = (), device: str = "cuda",
               backend_name: str = "quack", plan: RepPlan | None = None,
               name: str = "profile") -> StageResult:
    """Time the candidate (runner) interleaved with the baselines (checker) at every selected shape."""
    t0 = time.perf_counter()
    shapes: dict[str, ShapeTiming] = {}

    def result(outcome: Outcome, reason: str) -> StageResult:
        return StageResult(stage=name, outcome=outcome, reason=reason, seconds=time.perf_counter() - t0,
                           timings=shapes, details={"timing_method": TIMING_METHOD})

    try:
        with ctx.runner(backend_name, device, shared=device == "cuda") as client:
            for point in ctx.plan.points(ctx.task):
                try:
                    shapes[point.name] = timed = time_shape(ctx, client, point, device, compile_modes,
                                                            plan or RepPlan())
                except Reject as rej:
                    return result(rej.outcome, rej.reason)
                for part, seconds in timed.seconds.items():
                    # a phase's parts stand for it
                    if not any(other.startswith(f"{part}: ") for other in timed.seconds):
                        ctx.watch.add(part, seconds)
    except RunnerError as exc:
        return result(*runner_failure(exc, ctx.plan, Outcome.RUNTIME_ERROR, "timing failed:\n"))
    summary = "; ".join(f"{s}: {d.candidate.median_us:.0f} µs" for s, d in shapes.items())
    return result(Outcome.PASSED, f"median {summary}")


def time_shape(ctx: Context, client: RunnerClient, point: ShapePoint, device: str,
               compile_modes: Sequence[str], plan: RepPlan) -> ShapeTiming:
    """The timing protocol at one shape (module docstring): the candidate as loaded, with the baselines."""
    t0 = time.perf_counter()
    timer = ShapeTimer(ctx, client, point, device)
    variants = baseline_variants(ctx.task, point.dims, timer.first_inputs, device=device,
                                 compile_modes=compile_modes)
    setup = time.perf_counter() - t0
    timings = timer.time({"candidate": None}, variants, plan)
    t1 = time.perf_counter()
    timer.close()
    timer.refs.clear()
    del variants
    release(device)
    seconds = {"setup": setup, **timer.seconds, "close": time.perf_counter() - t1}
    return ShapeTiming(dims=point.dims, seconds={k: round(v, 2) for k, v in seconds.items()}, **timings)


class ShapeTimer:
    """The timing protocol at one shape, as often as asked over the same input sets (module docstring).

    Candidate variants are schedules: ``None`` runs forward() as loaded (its launches judged against the
    context's checked calls), a table runs it under that harness schedule (set in the runner before each of
    its batches; its launches judged against its own first traced call, as a config may change the kernels).
    """

    def __init__(self, ctx: Context, client: RunnerClient, point: ShapePoint, device: str) -> None:
        self.ctx, self.client, self.point, self.device = ctx, client, point, device
        self.rng = random.SystemRandom()
        seeds = [self.rng.randrange(1 << 30) for _ in range(TIMING_SETS)]
        self.ids = [f"t-{point.name}-{i}" for i in range(TIMING_SETS)]
        self.inputs = {i: ctx.task.make_inputs(point.dims, s, device=device) for i, s in zip(self.ids, seeds,
                                                                                             strict=True)}
        for i in self.ids:
            client.put(i, self.inputs[i])
        self.refs: dict[str, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}
        self.clock = Clock(device)
        self.cycle = 0
        self.overhead: dict[int, dict[str, float]] = {}
        self._set: Schedule | None = None  # the schedule the runner holds now (None: as loaded)
        self._judges: dict[frozenset[tuple[object, object]], Context] = {}
        self.seconds: dict[str, float] = {}  # the last time(): its warm-up, its timed rounds and their parts
        self._spent: dict[str, float] = {}  # seconds by part of the batches since the timed rounds began

    @property
    def first_inputs(self) -> dict[str, torch.Tensor]:
        return self.inputs[self.ids[0]]

    def _schedule(self, table: Schedule | None) -> Context:
        """Put the variant's schedule in the runner if it holds another; the context its launches are judged
        in."""
        want = table or {}
        if want != (self._set or {}):
            self.client.set_schedule(want)
        self._set = want
        if table is None:
            return self.ctx
        return self._judges.setdefault(frozenset(table.items()), replace(self.ctx, signatures={}))

    def candidate_batch(self, table: Schedule | None, n: int, check: bool, trace: bool = True) -> Batched:
        judge = self._schedule(table)
        calls = [self.ids[(self.cycle + j) % len(self.ids)] for j in range(n)]
        self.cycle += n
        keep = [self.rng.randrange(n)] if check else []
        point, task = self.point, self.ctx.task
        t0 = time.perf_counter()
        try:
            batch = self.client.run(calls, keep=keep, trace=trace)
        except CandidateRaised as exc:
            raise Reject(Outcome.RUNTIME_ERROR,
                         f"forward() raised while timed at shape {point.name}:\n{exc}") from None
        if trace:
            call_problems(judge, batch, point)
        t1 = time.perf_counter()
        self._spend("traced" if trace else "candidate", t1 - t0)
        if keep:
            (out,) = self.client.fetch(returned_bytes_limit(task, point, 1))
            t2 = time.perf_counter()
            self._spend("transfer", t2 - t1)
            ref32, reflp = self._references(calls[keep[0]])
            failed = [c for c in returned_checks(self.ctx, out, ref32, reflp, point, -1) if not c.ok]
            if failed:
                raise Reject(Outcome.CHEAT_DETECTED, (
                    f"at shape {point.name}, a call made while the kernel was being timed returned a wrong "
                    f"result ({failed[0].reason}); every call must compute the task"
                ))
            self._spend("checks", time.perf_counter() - t2)
        wall = max(0.0, batch.wall_s * 1e6 / n - self.overhead.get(n, {}).get("runner_us", 0.0))
        return Batched(batch.times_us, wall, batch.host_us)

    def _references(self, set_id: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The references of one input set: every set's kept while they take at most :data:`TIMING_REFS_BYTES`
        in all, or while the device's free memory holds two more sets' and a runner's peak, else only the
        last one computed. An LM head's FP32 logits run to GiBs a set: at the 256k head on the H200
        (h200-2026-12-06-a) each checked round whose set was not the last one computed ran the reference
        again, and the checks of timed calls took 4.0 s of a 38.9 s verification."""
        if set_id not in self.refs:
            refs = references(self.ctx.task, self.inputs[set_id])
            size = sum(t.numel() * t.element_size() for r in refs for t in r.values()
                       if isinstance(t, torch.Tensor))
            room = 2 * size + (self.client.peak_bytes or 0)  # and for a runner started again (the tune stage)
            if size * len(self.ids) > TIMING_REFS_BYTES and free_bytes(self.device) < room:
                self.refs.clear()
                release(self.device)
            self.refs[set_id] = refs
        return self.refs[set_id]

    def baseline_batch(self, name: str, fn: Callable[[], object], n: int) -> Batched:
        _sync(self.device)
        w0 = time.perf_counter()
        with torch.no_grad():
            times = self.clock.batch(fn, n)
        w1 = time.perf_counter()
        self._spend(name, w1 - w0)
        return Batched(times, max(0.0, (w1 - w0) * 1e6 / n - self.overhead.get(n, {}).get("checker_us", 0.0)))

    def _spend(self, where: str, seconds: float) -> None:
        self._spent[where] = self._spent.get(where, 0.0) + seconds

    def time(self, candidates: Mapping[str, Schedule | None], baselines: Mapping[str, Callable[[], object]],
             plan: RepPlan, checked_rounds: int | None = None) -> dict[str, Timing]:
        """Every candidate variant (runner) and baseline (checker), interleaved batch by batch in rotating
        order.

        A candidate's timed batches each keep one call's outputs for the check, or, with ``checked_rounds``,
        only that many of its rounds, drawn at random (the tune stage's search: fetching a large output costs
        more than timing it, and every schedule the search picks is timed again under full checks)."""
        names = [*candidates, *baselines]
        t0 = time.perf_counter()

        def one(name: str, n: int, check: bool = True, trace: bool = True) -> Batched:
            if name in candidates:
                return self.candidate_batch(candidates[name], n, check, trace)
            return self.baseline_batch(name, baselines[name], n)

        warmed: dict[str, float] = {}
        for name in names:  # warm-up: compiles, plans, allocator growth, cuBLAS heuristics
            # Untraced, like the correctness check's warm run: a first call at a shape may launch one-off
            # set-up kernels (the QuACK backend zeroes its tile counter and a new plan's); the traced batches
            # judge the rest.
            w0 = time.perf_counter()
            one(name, plan.warmup, check=False, trace=False)
            warmed[f"warm-up: {name}"] = time.perf_counter() - w0
        slowest = max(sorted(one(name, 3, check=checked_rounds is None).times_us)[1] for name in names)
        reps = plan.reps_for(slowest)
        size = min(BATCH, reps)
        rounds = -(-reps // size)
        checked = {n: range(rounds) if checked_rounds is None
                   else self.rng.sample(range(rounds), min(checked_rounds, rounds))
                   for n in candidates}
        if size not in self.overhead:
            self.overhead[size] = _overheads(self.clock, self.client, self.device, size)
        t1 = time.perf_counter()
        # the rounds sized, the harness's overheads measured
        warmed["warm-up: sizing"] = t1 - t0 - sum(warmed.values())
        self._spent = {}
        events: dict[str, list[float]] = {n: [] for n in names}
        walls: dict[str, list[float]] = {n: [] for n in names}
        hosts: dict[str, list[float]] = {n: [] for n in names}
        batch_medians: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                # A candidate's turn is a traced batch (launches judged, times unused) and the timed one, in
                # an order drawn here: forward() cannot count its way to the calls that are timed but not
                # traced. Only the timed batch keeps a call for the output check: the traced one's outputs
                # feed no number.
                traced_after = name in candidates and self.rng.random() < 0.5
                if name in candidates and not traced_after:
                    one(name, size, check=False)
                timed = one(name, size, check=r in checked.get(name, ()), trace=False)
                if traced_after:
                    one(name, size, check=False)
                events[name] += timed.times_us
                walls[name].append(timed.wall_us)
                hosts[name] += timed.host_us
                batch_medians[name].append(statistics.median(timed.times_us))
        parts = ("traced", "candidate", "transfer", "checks", *baselines)
        self.seconds = {"warm-up": t1 - t0, **warmed, "timed": time.perf_counter() - t1,
                        **{f"timed: {k}": self._spent.get(k, 0.0) for k in parts}}
        return {name: honest_timing(events[name], walls[name], hosts[name],
                                    batch_medians[name]) for name in names}

    def close(self) -> None:
        """Drop the input sets (forward() must have left them as they were sent) and any harness schedule."""
        if self._set:
            self.client.set_schedule({})
            self._set = None
        modified = self.client.drop(self.ids)
        changed = sorted({k for v in modified.values() for k in v})
        if changed:
            raise Reject(Outcome.CHEAT_DETECTED, f"at shape {self.point.name}, forward() modified its inputs "
                                                 f"{changed} while timed; inputs are read-only")


def free_bytes(device: str) -> int:
    """The device's free memory by the driver's count (what this process's allocator holds in reserve is not
    in it, nor what the runner holds); 0 off CUDA."""
    return int(torch.cuda.mem_get_info()[0]) if torch.device(device).type == "cuda" else 0


#: Events may understate the batch's wall clock per call by this much before the wall clock is reported.
WALL_SLACK, WALL_SLACK_US = 1.10, 20.0


@dataclass(frozen=True)
class Batched:
    """One timed batch of a variant: each call's events, the wall clock per call less the harness's own, and
    (the candidate's) the runner's host clock around each forward()."""

    times_us: list[float]
    wall_us: float
    host_us: list[float] = field(default_factory=list)


def honest_timing(events_us: list[float], walls_us: list[float], hosts_us: Sequence[float] = (),
                  batch_medians_us: Sequence[float] = ()) -> Timing:
    """The events' summary, or the wall clock's per-call median when the events claim clearly less; with the
    median host time of forward() where the runner reported it, and per round (one batch each: ``walls_us``
    and ``batch_medians_us``, the median of each batch's events) the batch's time by the same clock."""
    t = summarize(events_us)
    wall = summarize(walls_us).median_us
    both = {"events_median_us": t.median_us, "wall_median_us": wall,
            "host_median_us": summarize(list(hosts_us)).median_us if hosts_us else None}
    if wall > t.median_us * WALL_SLACK + WALL_SLACK_US:
        scale = wall / t.median_us if t.median_us > 0 else 1.0
        return Timing(median_us=wall, p10_us=(t.p10_us or wall) * scale, p90_us=(t.p90_us or wall) * scale,
                      reps=t.reps, bound="wall", rounds_us=list(walls_us) if batch_medians_us else [], **both)
    return t.model_copy(update={"bound": "events", "rounds_us": list(batch_medians_us), **both})


def _overheads(clock: Clock, client: RunnerClient, device: str, n: int) -> dict[str, float]:
    """Per call, what a batch's wall clock holds besides the work: the harness's own marker, flush and events.

    Measured, not assumed: a dry batch in the runner (everything but forward) and a no-op batch here.
    """
    dry = sorted(client.run([""] * n, keep=[], dry=True,
                            trace=False).wall_s for _ in range(5))[2] if n else 0.0
    w = []
    for _ in range(5):
        _sync(device)
        w0 = time.perf_counter()
        clock.batch(lambda: None, n)
        w.append(time.perf_counter() - w0)
    return {"runner_us": dry * 1e6 / max(n, 1), "checker_us": sorted(w)[2] * 1e6 / max(n, 1)}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
