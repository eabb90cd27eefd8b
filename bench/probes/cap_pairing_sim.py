"""Why the bench pairs its ratios round by round: a simulation of two equal kernels timed under a bursty power cap.

On the H200 the SW-power-cap clock-event reason comes and goes in bursts of about a second while long GEMMs run
(bench/results/h200-2026-12-02-{e,f}-notes.md), and the LM-head rows, timed in 3-5 interleaved rounds of 5 calls
of 5-6 ms, showed two modes about 10% apart within one variant's samples (p10 5,464 and median 5,999 µs at
gemm_rmsnorm_cross_entropy coda-h4096, 8e0b4d6). This simulation times five equal variants of ``CALL_US`` the way
``verifier.gpu.ShapeTimer.time`` interleaves them (batches of 5, rotating order), under a cap that slows every call by
``SLOWDOWN`` while on, its on and off spells exponential with the given means, and compares two estimators of the
ratio of two of them (truth: 1.0): the ratio of their medians, and :func:`coda_agent.measure.timing.paired_ratio`.
A model, not a measurement: the next whole-suite bench shows what pairing does to the real rows' swings.

    python bench/probes/cap_pairing_sim.py
"""

from __future__ import annotations

import random
import statistics

from coda_agent.measure.timing import Timing, paired_ratio

CALL_US = 6000.0
SLOWDOWN = 1.10
VARIANTS = 5
BATCH = 5
TRIALS = 400


def timed(reps: int, on_s: float, off_s: float, seed: int) -> list[Timing]:
    """Every variant's calls, in interleaved rounds as the bench runs them, as Timings with their rounds."""
    rng = random.Random(seed)
    now, capped = 0.0, rng.random() < on_s / (on_s + off_s)
    switch = rng.expovariate(1 / (on_s if capped else off_s))
    calls: list[list[float]] = [[] for _ in range(VARIANTS)]
    rounds: list[list[float]] = [[] for _ in range(VARIANTS)]
    for r in range(-(-reps // BATCH)):
        k = r % VARIANTS
        for v in [*range(k, VARIANTS), *range(k)]:
            batch = []
            for _ in range(BATCH):
                while now >= switch:
                    capped = not capped
                    switch += rng.expovariate(1 / (on_s if capped else off_s))
                us = CALL_US * (SLOWDOWN if capped else 1.0) * (1 + rng.gauss(0, 0.003))
                batch.append(us)
                now += us / 1e6
            calls[v] += batch
            rounds[v].append(statistics.median(batch))
    return [Timing(median_us=statistics.median(c), rounds_us=r) for c, r in zip(calls, rounds, strict=True)]


def main() -> None:
    print(f"{'cap on/off spells (s)':>22} {'reps':>5}  {'median ratio: p5-p95, >3% off':>32}  {'paired: p5-p95, >3% off':>26}")
    for on_s, off_s in ((0.2, 0.5), (0.5, 1.0), (1.0, 1.0), (2.0, 2.0)):
        for reps in (15, 25, 60):
            medians, paired = [], []
            for seed in range(TRIALS):
                kernel, cublas = timed(reps, on_s, off_s, seed)[:2]
                medians.append(cublas.median_us / kernel.median_us)
                paired.append(paired_ratio(cublas, kernel))

            def spread(xs: list[float]) -> str:
                xs = sorted(xs)
                off = sum(abs(x - 1) > 0.03 for x in xs) / len(xs)
                return f"{xs[len(xs) // 20]:.3f}-{xs[len(xs) * 19 // 20]:.3f}, {off:4.0%}"

            print(f"{on_s:>10.1f} / {off_s:<9.1f} {reps:>5}  {spread(medians):>32}  {spread(paired):>26}")


if __name__ == "__main__":
    main()
