"""The ``coda-agent`` command line: each command family lives in its own module and registers on ``app``
(:mod:`.core`, with what the commands share) when imported, here; add new ones to this line."""

from __future__ import annotations

# they register
from . import bench_cmd, providers_cmd, run_command, store_cmd, tasks_cmd, verify_cmd  # noqa: F401
from .core import app, main

__all__ = ["app", "main"]
