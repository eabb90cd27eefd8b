"""The timing protocol: interleaved repetitions, a cold L2 before each one, median and spread.

Method: CUDA events around each call on the current stream, with the L2 flushed (a 256 MiB memset) just
before the start event. Why events and not CUDA-graph replay: QuACK's eager call does host work on every
call (plan lookup, output allocation) and the agent's kernels are used eagerly, so that host cost is part
of what a user pays; at these millisecond-scale shapes the GPU work dwarfs it anyway (the flush gives the
host ~60 µs of slack to enqueue the call). Graph replay would hide the host cost and forbid the harness's
own allocations between calls.

Variants (candidate, eager, torch.compile, cuBLAS) are timed interleaved, batch by batch and in rotating
order, so clock and thermal drift hit every variant alike. A batch is :data:`BATCH` calls after a synchronize,
opened by a device sleep that lets the host run ahead (:func:`lead_in`): the verifier's protocol, which the
peaks and the probes share, so every figure is taken at the same operating point (timed back to back without
the pauses, the H200 ran every GEMM of a probe 15-20% slower than the bench did, cuBLAS at 8192x4096x14336 in
1,403 µs against 1,170: most likely its sustained clock against the one the bench sees).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:  # torch is imported where the GPU is timed: reading timings (the leaderboard) stays fast
    import torch

#: Bytes written to flush the L2 before each timed call (the H200's L2 is 50 MB; 256 MiB as in Triton).
FLUSH_BYTES = 256 * 1024 * 1024
#: GPU cycles (~1 ms on an H200) of ``torch.cuda._sleep`` that open a batch of timed calls: the host gets
#: ahead of the device before the first call, so no call's events hold the host's latency to its first launch.
LEAD_CYCLES = 2_000_000
#: Calls per timed batch.
BATCH = 5
#: A candidate whose forward() spends at least this share of its median time on the host is host-bound: the
#: GPU waited for its launches, so the time is the host's, not the kernel's. (A forward() that itself waits
#: for the GPU, with ``.item()`` or a synchronize, counts that wait as host time too: it serialises the two
#: all the same.)
HOST_BOUND_SHARE = 0.8


def lead_in(device: str) -> None:
    """Give the host a head start on the device before a batch of timed calls (see LEAD_CYCLES)."""
    if device == "cuda":
        import torch

        torch.cuda._sleep(LEAD_CYCLES)


class Timing(BaseModel):
    """One timed variant: median and spread over repetitions, in microseconds."""

    median_us: float
    p10_us: float | None = None
    p90_us: float | None = None
    reps: int = 0
    bound: str | None = Field(default=None,
                              description="events | wall: which clock set the median (verifier timings)")
    events_median_us: float | None = Field(default=None,
                                           description="verifier timings: the CUDA events' median")
    wall_median_us: float | None = Field(default=None,
                                         description="verifier timings: the checker's wall clock per call")
    host_median_us: float | None = Field(default=None, description=(
        "candidate timings: the runner's host clock around forward() per call; near the median or above it, "
        "the GPU waited for forward()'s launches (host-bound)"))
    rounds_us: list[float] = Field(default_factory=list, description=(
        "per round of the interleaved batches, this variant's batch time per call (by the clock that set the "
        "median), in order: variants timed together pair up round by round (:func:`paired_ratio`)"))

    @property
    def gpu_us(self) -> float:
        """The CUDA events' median where the verifier timed them, else the median: what a kernel config
        changes (a host-bound forward() takes its host time whatever its kernels run, so the median would hide
        it)."""
        return self.events_median_us if self.events_median_us is not None else self.median_us

    @property
    def host_bound(self) -> bool:
        """forward()'s host time is :data:`HOST_BOUND_SHARE` of the median or more: the GPU waited for the
        host."""
        return self.host_median_us is not None and self.host_median_us >= HOST_BOUND_SHARE * self.median_us


def paired_ratio(base: Timing, candidate: Timing) -> float:
    """``base``'s time over ``candidate``'s (> 1: the candidate is faster): the median over the interleaved
    rounds of the ratio of their batches in one round, where both carry the same rounds; else the ratio of
    their medians.

    Paired because the GPU's clock moves under its power cap in bursts longer than a round (bench/README.md,
    the LM heads): two batches a few milliseconds apart run at the same clock, while each side's median alone
    may fall on either side of a burst. In ``bench/probes/cap_pairing_sim.py``'s model (a 10% cap in spells of
    0.2-2 s, 15 reps) the medians of two equal kernels differed by more than 3% in 6-17% of trials, the paired
    ratio in 0-3%. On the H200 the LM-head rows still moved 4-10% between benches with it: their rounds
    flipped between modes within a round, and there were three of them (:class:`RepPlan` now asks for
    nine)."""
    if base.rounds_us and len(base.rounds_us) == len(candidate.rounds_us) and all(candidate.rounds_us):
        return statistics.median(b / c for b, c in zip(base.rounds_us, candidate.rounds_us, strict=True))
    return base.median_us / candidate.median_us


def fastest_round_ratio(base: Timing, candidate: Timing) -> float:
    """``base``'s fastest round over ``candidate``'s (> 1: the candidate is faster), where both carry rounds;
    else the ratio of their medians. A round is one batch's median, so no single call sets it.

    What the bench holds a kernel to (its targets), because the H200 times every long kernel in one of two
    modes about 10% apart, round by round and side by side independently (bench/README.md, the LM heads), so
    the paired median falls on whichever mode holds the middle round. The fastest rounds compare like with
    like: over the 57 rows whose kernels did not change between the whole-suite benches at 006be5d and
    46964b5, the ratio to cuBLAS moved at most 0.008 between them by this ratio and up to 0.090 by
    :func:`paired_ratio` (``bench/probes/ratio_stability.py``). Not for a candidate's speedups: one batch that
    skips the work would set it, where the paired median needs most of the rounds, and the verifier checks one
    call per batch."""
    if base.rounds_us and candidate.rounds_us and all(candidate.rounds_us):
        return min(base.rounds_us) / min(candidate.rounds_us)
    return base.median_us / candidate.median_us


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of an already sorted list."""
    if not sorted_values:
        raise ValueError("percentile of an empty list")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_us: list[float]) -> Timing:
    """Median and p10/p90 of per-call times in microseconds."""
    s = sorted(samples_us)
    return Timing(median_us=percentile(s, 50), p10_us=percentile(s, 10), p90_us=percentile(s, 90),
                  reps=len(s))


class Clock:
    """Measures one call; ``cuda`` uses events on the current stream, ``cpu`` the host clock (tests)."""

    def __init__(self, device: str = "cuda", flush_bytes: int = FLUSH_BYTES) -> None:
        import torch

        self.device = device
        self._flush: torch.Tensor | None = torch.empty(flush_bytes // 4, dtype=torch.int32,
                                                       device=device) if device == "cuda" else None
        self._pending: list[tuple[object, object]] = []

    def flush_l2(self) -> None:
        if self._flush is not None:
            self._flush.zero_()

    def start(self, fn: Callable[[], object]) -> int:
        """Flush, then time ``fn()``; returns a handle whose time :meth:`collect` reads later."""
        self.flush_l2()
        if self.device == "cuda":
            import torch

            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            self._pending.append((begin, end))
        else:
            t0 = time.perf_counter()
            fn()
            self._pending.append((t0, time.perf_counter()))
        return len(self._pending) - 1

    def collect(self) -> list[float]:
        """Microseconds of every call started since the last collect, in start order."""
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            out = [b.elapsed_time(e) * 1e3 for b, e in self._pending]  # type: ignore[attr-defined]
        else:
            out = [(e - b) * 1e6 for b, e in self._pending]  # type: ignore[operator]
        self._pending.clear()
        return out

    def batch(self, fn: Callable[[], object], n: int) -> list[float]:
        """One batch (module docstring): the lead-in, ``n`` timed calls, then their microseconds. The device
        should be idle when it starts (the last :meth:`collect` left it so)."""
        lead_in(self.device)
        for _ in range(n):
            self.start(fn)
        return self.collect()


@dataclass(frozen=True)
class RepPlan:
    """How many repetitions: enough for ``target_s`` of measured time per variant, within [min, max].

    The minimum is nine rounds of :data:`BATCH`: a ratio is the median of paired rounds
    (:func:`paired_ratio`), and at the LM-head rows, where eager's 10 ms sized the reps to the old minimum of
    three rounds, the H200's rounds flipped between two modes about 10% apart, and ratios moved 4-10% between
    benches (bench/results/h200-2026-12-02-g-notes.md). Only variants slower than ~3 ms get more reps from it.
    """

    warmup: int = 3
    target_s: float = 0.15
    min_reps: int = 9 * BATCH
    max_reps: int = 60

    def reps_for(self, slowest_us: float) -> int:
        want = int(self.target_s * 1e6 / max(slowest_us, 1.0))
        return max(self.min_reps, min(self.max_reps, want))


def time_interleaved(
    variants: Mapping[str, Callable[[], object]], clock: Clock, plan: RepPlan = RepPlan()
) -> dict[str, Timing]:
    """Time every variant, interleaved batch by batch in rotating order; returns a Timing per variant, with
    its batches' medians round by round (for :func:`paired_ratio`).

    Warm-up calls (compiles, allocator growth, cuBLAS heuristics) run first and are not measured; three
    probe reps then size the run so the slowest variant gets about ``plan.target_s`` of samples, in whole
    batches.
    """
    names = list(variants)
    for _ in range(plan.warmup):
        for name in names:
            variants[name]()
    probe = _run_reps(variants, names, clock, 3)
    reps = plan.reps_for(max(sorted(x for batch in v for x in batch)[1] for v in probe.values()))
    batches = _run_reps(variants, names, clock, reps)
    return {
        name: summarize([x for batch in batches[name] for x in batch]).model_copy(
            update={"rounds_us": [statistics.median(batch) for batch in batches[name]]})
        for name in names
    }


def _run_reps(
    variants: Mapping[str, Callable[[], object]], names: list[str], clock: Clock, reps: int
) -> dict[str, list[list[float]]]:
    """At least ``reps`` calls of each variant, in batches (one per variant and round); the first variant of a
    round rotates."""
    clock.collect()  # the device idle before the first lead-in
    size = min(BATCH, reps)
    batches: dict[str, list[list[float]]] = {n: [] for n in names}
    for r in range(-(-reps // size)):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            batches[name].append(clock.batch(variants[name], size))
    return batches
