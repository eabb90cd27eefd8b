"""The one rule for "best": correct, timed, lower geomean time over the shapes, earlier; and the
population."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from coda_agent.messages import ChatMessage
from coda_agent.store.ranking import (
    attempt_time_us,
    best_attempt,
    code_fingerprint,
    geomean,
    population,
    speed_key,
)
from coda_agent.store.records import Attempt
from coda_agent.verifier.verdict import Outcome, Verdict

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def attempt(index: int, times: dict[str, float] | None, *, passed: bool = True,
            code: str | None = None) -> Attempt:
    verdict = Verdict(task="t", task_version=1, backend="quack",
                      outcome=Outcome.PASSED if passed else Outcome.WRONG_OUTPUT)
    timing = {"shapes": {s: {"median_us": us} for s, us in times.items()}} if times else {}
    return Attempt(
        index=index, round=index, slot=0, started=NOW, finished=NOW,
        messages=[ChatMessage(role="user", content="t")],
        code=code if code is not None else f"def forward():\n    return {{'v': {index}}}\n", verdict=verdict,
        timing=timing,
    )


def test_geomean_skips_what_is_not_a_time():
    assert geomean([100.0, 400.0]) == pytest.approx(200.0)
    assert geomean([None, 0.0, float("inf"), 50.0]) == pytest.approx(50.0)
    assert geomean([]) is None


def test_best_is_the_lowest_geomean_over_shapes_not_the_fastest_single_shape():
    steady = attempt(1, {"a": 100.0, "b": 100.0})  # geomean 100
    spiky = attempt(2, {"a": 40.0, "b": 300.0})  # geomean ~109.5, though faster at shape a
    assert attempt_time_us(spiky) == pytest.approx((40 * 300) ** 0.5)
    assert best_attempt([spiky, steady]) is steady


def test_correct_beats_wrong_timed_beats_untimed_ties_go_to_the_earlier():
    wrong = attempt(1, {"a": 1.0}, passed=False)
    untimed = attempt(2, None)
    slow, tie = attempt(3, {"a": 200.0}), attempt(4, {"a": 200.0})
    assert best_attempt([wrong]) is None
    assert best_attempt([wrong, untimed]) is untimed
    assert best_attempt([tie, untimed, slow, wrong]) is slow
    assert sorted([tie, untimed, slow, wrong], key=speed_key) == [slow, tie, untimed, wrong]


def test_population_is_the_best_distinct_correct_candidates_best_first():
    base = "def forward(x):\n    return {'y': x}\n"
    a = attempt(1, {"a": 300.0}, code=base)
    same = attempt(2, {"a": 290.0},
                   code="# the same module, re-laid out\ndef forward(x):\n    return {'y':   x}\n")
    b, c, d = attempt(3, {"a": 100.0}), attempt(4, {"a": 200.0}), attempt(5, {"a": 250.0})
    wrong = attempt(6, {"a": 1.0}, passed=False)
    assert code_fingerprint(a.code) == code_fingerprint(same.code)
    assert population([a, same, b, c, d, wrong], 3) == [b, c, d]
    assert population([a, same, b, wrong], 5) == [b, same]  # a resubmission counts once, at its best time
    assert population([wrong], 3) == []
