"""Live provider checks, for developers with API keys. Marked ``api``: deselected by default, never run in CI.

Run with ``pytest -m api`` after exporting ANTHROPIC_API_KEY / OPENAI_API_KEY (and CODA_AGENT_LIVE_MODEL_*
to choose models). Each test skips when its key is absent.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from coda_agent.messages import ChatMessage
from coda_agent.providers import get_provider

pytestmark = pytest.mark.api

LIVE = [
    ("ANTHROPIC_API_KEY", os.environ.get("CODA_AGENT_LIVE_MODEL_ANTHROPIC", "anthropic/claude-sonnet-4-5")),
    ("OPENAI_API_KEY", os.environ.get("CODA_AGENT_LIVE_MODEL_OPENAI", "openai/gpt-4.1-mini")),
]


@pytest.mark.parametrize(("key", "spec"), LIVE, ids=[s for _, s in LIVE])
def test_a_real_model_answers_and_reports_usage(key, spec, monkeypatch):
    if not os.environ.get(key):
        pytest.skip(f"{key} is not set")
    monkeypatch.delenv("CODA_AGENT_NO_REAL_API", raising=False)
    provider = get_provider(spec)
    messages = [
        ChatMessage(role="system", content="You answer with one word."),
        ChatMessage(role="user", content="What is the capital of France?"),
    ]
    reply = asyncio.run(provider.complete(messages, max_tokens=20, temperature=0.0))
    assert "paris" in reply.text.lower()
    assert reply.input_tokens > 0 and reply.output_tokens > 0
