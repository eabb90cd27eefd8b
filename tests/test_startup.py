"""The read-only commands start without torch: importing the CLI, ``--help``, ``tasks``, ``leaderboard`` and
``providers`` load neither torch nor the checker, so they answer in a fraction of the time torch takes to
import (issue 41). Checked by what is in ``sys.modules``, not by a clock, in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import REPO

#: Modules that carry the kernel stack: none of them may load for a listing.
HEAVY = ("torch", "coda_agent.verifier.stages", "coda_agent.verifier.client", "coda_agent.agent")

PROBE = """
import contextlib, io, json, sys
from coda_agent.cli import main
loaded = {"import": [m for m in HEAVY if m in sys.modules]}
for args in COMMANDS:
    sys.argv = ["coda-agent", *args]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    loaded[" ".join(args)] = [m for m in HEAVY if m in sys.modules] + ([f"exit {code}"] if code else [])
print(json.dumps(loaded))
"""


@pytest.mark.parametrize("commands", [
    [["--help"]], [["tasks"]], [["leaderboard"]], [["providers"]], [["run", "--help"]],
    [["validate", "--help"], ["verify", "--help"], ["bench", "--help"], ["show", "--help"],
     ["api-doc", "--help"]],
])
def test_read_only_commands_do_not_import_torch(commands, tmp_path):
    code = f"HEAVY = {HEAVY!r}\nCOMMANDS = {commands!r}\n" + PROBE
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CODA_AGENT_RUNS_DIR": str(tmp_path / "runs"),
           "COLUMNS": "100"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {k: [] for k in loaded}, loaded


def test_the_cli_package_imports_no_torch():
    """The same check on the package alone, in the repository (what `python -X importtime` looks at)."""
    code = ("import sys, coda_agent.cli; print(sorted(m for m in sys.modules if m == 'torch' or "
            "m.startswith('torch.')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_one_run_and_the_sweep_do_not_import_each_other():
    """``run_cmd`` (one run) sits below ``sweep``; the ``run`` command (``run_command``) sits above both."""
    import ast

    cli = REPO / "coda_agent" / "cli"

    def imported(name: str) -> set[str]:
        tree = ast.parse((cli / f"{name}.py").read_text())
        return {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1}

    assert "sweep" not in imported("run_cmd") and "run_command" not in imported("run_cmd")
    assert "run_command" not in imported("sweep")
