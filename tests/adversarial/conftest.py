"""Fixtures of the adversarial suite: one fake agent per session, a fresh loopback listener per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .harness import SECRET_ENV, Agent, Listener


@pytest.fixture(scope="session")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """The stand-in for ``coda-agent run``: started with the fake keys in its initial environment."""
    a = Agent(tmp_path_factory.mktemp("adv_agent"))
    a.start()
    yield a
    a.stop()


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()


@pytest.fixture(autouse=True)
def _planted_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake keys in this process's environment too (a verifier that passes its own environment on)."""
    for k, v in SECRET_ENV.items():
        monkeypatch.setenv(k, v)
