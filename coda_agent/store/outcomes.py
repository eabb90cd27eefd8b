"""What became of one attempt: the verifier's :class:`~coda_agent.verifier.verdict.Outcome`, or how it ended
before there was anything to verify.

Every table keyed by outcome (the CLI's colours, the viewer's styles, the prompts' ranking and advice) covers
every member; ``tests/test_outcomes.py`` holds them to it, so a new outcome cannot fall through to a default.
"""

from __future__ import annotations

from enum import Enum

from ..verifier.verdict import Outcome


class AttemptOutcome(str, Enum):
    """The verifier's outcomes, under the same names and values, then the three ends that precede a
    verdict."""

    PASSED = "passed"
    STATIC_REJECTED = "static_rejected"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    WRONG_OUTPUT = "wrong_output"
    CHEAT_DETECTED = "cheat_detected"
    OVER_LAUNCH_BUDGET = "over_launch_budget"
    TIMEOUT = "timeout"
    CRASH = "crash"
    INFRA_ERROR = "infra_error"
    PROVIDER_ERROR = "provider_error"  # the model request failed: there is no reply
    NO_CODE = "no_code"  # the reply held no Python module to verify
    UNVERIFIED = "unverified"  # code, but no verdict recorded for it

    def __str__(self) -> str:
        """The value, as records, templates and tables print it (a str-mixin enum would print its class
        name)."""
        return self.value

    @classmethod
    def of_verdict(cls, outcome: Outcome) -> AttemptOutcome:
        """The attempt outcome a verdict's outcome is (same value)."""
        return cls(outcome.value)
