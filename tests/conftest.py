"""Shared fixtures. GPU tests (marker ``gpu``) skip without a CUDA device; ``api`` tests never run in CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TASK_DIR = REPO / "tasks"

# Never let a test reach a real LLM API, whatever the environment holds.
os.environ.setdefault("CODA_AGENT_NO_REAL_API", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _quack_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Compile-only tests share one QuACK cache per session (compiles are keyed, so this is safe)."""
    os.environ.setdefault("QUACK_CACHE_DIR", str(tmp_path_factory.mktemp("quack_cache")))


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test writes run records into the repository or reads its committed bench results by accident."""
    base = tmp_path_factory.mktemp("store")
    monkeypatch.setenv("CODA_AGENT_RUNS_DIR", str(base / "runs"))
    monkeypatch.setenv("CODA_AGENT_BENCH_DIR", str(base / "bench"))
