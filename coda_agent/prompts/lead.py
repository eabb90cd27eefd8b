"""Which reply of a round the conversation continues from (the lead), best first.

Correct replies are ordered by the one rule in :mod:`coda_agent.store.ranking`; a failed reply by how
close its outcome came to success, then (for wrong outputs) by how far off its worst output is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..store.outcomes import AttemptOutcome
from ..store.ranking import speed_key
from ..store.records import Attempt

#: Closest to success first. A provider error is never the lead (there is no reply), but it ranks here too.
OUTCOME_CLOSENESS: dict[AttemptOutcome, int] = {
    AttemptOutcome.PASSED: 0,
    AttemptOutcome.WRONG_OUTPUT: 1,
    AttemptOutcome.OVER_LAUNCH_BUDGET: 2,
    AttemptOutcome.CHEAT_DETECTED: 3,
    AttemptOutcome.COMPILE_ERROR: 4,
    AttemptOutcome.RUNTIME_ERROR: 5,
    AttemptOutcome.TIMEOUT: 6,
    AttemptOutcome.CRASH: 7,
    AttemptOutcome.STATIC_REJECTED: 8,
    AttemptOutcome.INFRA_ERROR: 9,
    AttemptOutcome.UNVERIFIED: 10,
    AttemptOutcome.NO_CODE: 11,
    AttemptOutcome.PROVIDER_ERROR: 12,
}


def worst_error_ratio(attempt: Attempt) -> float:
    """A wrong output's largest error over the allowed error (inf when an output has no error figure); 0
    otherwise."""
    if attempt.verdict is None or attempt.outcome is not AttemptOutcome.WRONG_OUTPUT:
        return 0.0
    ratios = [r for c in attempt.verdict.worst_checks() if (r := c.error_ratio) is not None]
    return max(ratios) if ratios else float("inf")


def lead_key(attempt: Attempt) -> tuple[Any, ...]:
    """Sort key, best first: a correct attempt by ``store.ranking``, a failed one by outcome, error ratio and
    slot. A wrong output with no error figure (NaN, a wrong shape) comes after one over the launch budget,
    whose outputs were right (a manual seat's round went on from the NaN)."""
    closeness: float = OUTCOME_CLOSENESS[attempt.outcome]
    if attempt.passed:
        return (closeness, *speed_key(attempt))
    ratio = worst_error_ratio(attempt)
    if attempt.outcome is AttemptOutcome.WRONG_OUTPUT and ratio == float("inf"):
        closeness = OUTCOME_CLOSENESS[AttemptOutcome.OVER_LAUNCH_BUDGET] + 0.5
    return (closeness, ratio, attempt.slot)


def replied(attempts: Iterable[Attempt]) -> list[Attempt]:
    """Attempts the model actually produced (a failed request says nothing about the model's code)."""
    return [a for a in attempts if a.raw_response is not None
            and a.outcome is not AttemptOutcome.PROVIDER_ERROR]


def lead_attempt(attempts: Sequence[Attempt]) -> Attempt | None:
    """The attempt the conversation continues from: the best reply of the latest round that has one."""
    replies = replied(attempts)
    if not replies:
        return None
    last_round = max(a.round for a in replies)
    return min((a for a in replies if a.round == last_round), key=lead_key)
