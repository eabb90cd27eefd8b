"""One enum of attempt outcomes, and every table keyed by it covers every member (no outcome falls to a
default)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from coda_agent.cli.core import OUTCOME_STYLE, outcome_style
from coda_agent.messages import ChatMessage
from coda_agent.prompts.feedback import NEXT_STEP
from coda_agent.prompts.lead import OUTCOME_CLOSENESS
from coda_agent.store.outcomes import AttemptOutcome
from coda_agent.store.records import Attempt
from coda_agent.verifier.verdict import Outcome, Verdict

VIEWER_CSS = Path(__file__).resolve().parents[1] / "coda_agent" / "viewer" / "static" / "style.css"
BEFORE_A_VERDICT = {AttemptOutcome.PROVIDER_ERROR, AttemptOutcome.NO_CODE, AttemptOutcome.UNVERIFIED}
NOW = datetime(2026, 11, 29, tzinfo=timezone.utc)


def attempt(**kw) -> Attempt:
    return Attempt(index=1, round=1, slot=0, started=NOW, finished=NOW,
                   messages=[ChatMessage(role="user", content="t")], **kw)


def test_the_attempt_outcomes_are_the_verifiers_plus_the_ends_before_a_verdict():
    assert ([(o.name, o.value) for o in Outcome]
            == [(o.name, o.value) for o in AttemptOutcome if o not in BEFORE_A_VERDICT])
    assert {AttemptOutcome.of_verdict(o) for o in Outcome} == set(AttemptOutcome) - BEFORE_A_VERDICT
    # as records print it
    assert str(AttemptOutcome.WRONG_OUTPUT) == f"{AttemptOutcome.WRONG_OUTPUT}" == "wrong_output"


def test_an_attempt_says_which_outcome_it_had():
    verdict = Verdict(task="t", task_version=1, backend="torch", outcome=Outcome.CHEAT_DETECTED)
    assert attempt(provider_error="rate_limit: slow down").outcome is AttemptOutcome.PROVIDER_ERROR
    assert attempt(raw_response="no idea").outcome is AttemptOutcome.NO_CODE
    assert attempt(raw_response="```python\nx\n```", code="x").outcome is AttemptOutcome.UNVERIFIED
    assert attempt(raw_response="...", code="x", verdict=verdict).outcome is AttemptOutcome.CHEAT_DETECTED


def test_an_attempt_gives_one_reason_wherever_it_is_shown():
    verdict = Verdict(task="t", task_version=1, backend="torch", outcome=Outcome.WRONG_OUTPUT,
                      reason="output 'h' is off")
    assert attempt(provider_error="rate_limit: slow down").reason == "rate_limit: slow down"
    assert attempt(raw_response="no idea", extraction_error="no code block").reason == "no code block"
    assert attempt(raw_response="...", code="x", verdict=verdict).reason == "output 'h' is off"
    assert attempt(raw_response="...", code="x").reason == ""


def test_the_cli_colours_every_outcome_from_one_table():
    assert set(OUTCOME_STYLE) == set(AttemptOutcome)
    assert outcome_style("no_code") == outcome_style(AttemptOutcome.NO_CODE) == "yellow"
    assert outcome_style(Outcome.INFRA_ERROR.value) == "magenta"  # a verifier stage's outcome reads the same
    with pytest.raises(ValueError):
        outcome_style("no_such_outcome")


def test_the_viewer_styles_every_outcome():
    css = VIEWER_CSS.read_text()
    pills = set(re.findall(r"\.outcome-(?!text-)([a-z_]+)", css))
    texts = set(re.findall(r"\.outcome-text-([a-z_]+)", css))
    assert pills == texts == {o.value for o in AttemptOutcome}


def test_the_prompts_rank_and_advise_on_every_outcome():
    assert set(OUTCOME_CLOSENESS) == set(AttemptOutcome)
    assert len(set(OUTCOME_CLOSENESS.values())) == len(OUTCOME_CLOSENESS)  # a strict order
    assert min(OUTCOME_CLOSENESS, key=OUTCOME_CLOSENESS.__getitem__) is AttemptOutcome.PASSED
    # the advice after a failed round, by the lead reply's outcome: a lead is a reply, never a failed request
    assert set(NEXT_STEP) == set(AttemptOutcome) - {AttemptOutcome.PASSED, AttemptOutcome.PROVIDER_ERROR}
