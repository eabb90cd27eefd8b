"""Where coda-agent keeps things, and the environment variables that move them: one home for each setting.

| variable | default | what |
|---|---|---|
| ``CODA_AGENT_RUNS_DIR`` | ``./runs`` | run records (and the SQLite index inside it) |
| ``CODA_AGENT_BENCH_DIR`` | ``./bench/results`` | bench results the bench writes and the leaderboard reads |
| ``CODA_AGENT_CACHE_DIR`` | ``$XDG_CACHE_HOME/coda-agent`` (``~/.cache/coda-agent``) | the tune stage's cache
of tuned configs |
| ``CODA_AGENT_TASKS`` | (none) | extra task folders, ``os.pathsep``-separated (``tasks.loader``) |
| ``CODA_AGENT_BWRAP`` | ``bwrap`` on the PATH | the bubblewrap binary the verifier's sandbox runs
(``verifier.sandbox``) |
| ``CODA_AGENT_ALLOW_UNSANDBOXED`` | unset | let real-API runs proceed without the OS sandbox |
| ``CODA_AGENT_GIT_COMMIT`` | ``git rev-parse HEAD`` | the commit recorded with results, when the tree travels
without ``.git`` |
| ``CODA_AGENT_NO_REAL_API`` | unset | refuse every real provider endpoint (tests set it) |
| ``CODA_AGENT_PRICES`` | built-in table | a price file for the providers |
| ``CODA_AGENT_MODEL`` | unset | the default ``--model`` of ``coda-agent run`` |
| ``CODA_AGENT_RETRY_BASE_DELAY`` | the providers' own | backoff base in seconds (``0``: no waits, for tests)
|
"""

from __future__ import annotations

import os
from pathlib import Path

RUNS_DIR_ENV = "CODA_AGENT_RUNS_DIR"
BENCH_DIR_ENV = "CODA_AGENT_BENCH_DIR"
CACHE_DIR_ENV = "CODA_AGENT_CACHE_DIR"
DEFAULT_RUNS_DIR = Path("runs")
DEFAULT_BENCH_DIR = Path("bench/results")


def runs_dir() -> Path:
    """``$CODA_AGENT_RUNS_DIR``, else ``./runs``."""
    return Path(os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_DIR)


def bench_dir() -> Path:
    """``$CODA_AGENT_BENCH_DIR``, else ``./bench/results``."""
    return Path(os.environ.get(BENCH_DIR_ENV) or DEFAULT_BENCH_DIR)


def cache_dir() -> Path:
    """``$CODA_AGENT_CACHE_DIR``, else ``$XDG_CACHE_HOME/coda-agent``, else ``~/.cache/coda-agent``."""
    named = os.environ.get(CACHE_DIR_ENV)
    if named:
        return Path(named)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "coda-agent"
