"""The README's tour runs as typed: its marked block, line by line in one shell, on the CPU with no API key.

The block runs in a folder laid out like a fresh clone (the checkout's tracked top-level entries linked in,
the example records copied, no ``runs/``), so it writes nothing into the checkout. ``source
.venv/bin/activate`` there puts a ``coda-agent`` on PATH that runs this checkout's package with this
interpreter.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .conftest import REPO

MARKER = "<!-- tour:"
#: What a clone has at its top level that the tour may read (the rest: .git, .venv, runs/ and other local
#: state).
CLONE_ENTRIES = ("README.md", "pyproject.toml", "bench", "coda_agent", "docs", "scripts", "tests")


def tour_commands(readme: str) -> list[str]:
    """The commands of the fenced block after the tour marker, one per line, comments kept (bash drops
    them)."""
    lines = readme.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith(MARKER)]
    assert lines[start + 1] == "```bash", "the tour marker must sit right above a ```bash block"
    end = lines.index("```", start + 2)
    return [line for line in lines[start + 2:end] if line.strip()]


def fresh_clone(root: Path) -> Path:
    clone = root / "clone"
    clone.mkdir()
    for name in CLONE_ENTRIES:
        (clone / name).symlink_to(REPO / name)
    shutil.copytree(REPO / "examples", clone / "examples", ignore=shutil.ignore_patterns("index.db*"))
    venv_bin = clone / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    shim = venv_bin / "coda-agent"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m coda_agent "$@"\n')
    shim.chmod(0o755)
    (venv_bin / "activate").write_text(f'export PATH="{venv_bin}:$PATH"\n')
    return clone


def test_the_readme_starts_with_the_two_commands_and_the_tour_uses_them():
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    main_job, tests = blocks[0].splitlines()
    assert (main_job.startswith("bash scripts/setup.sh && .venv/bin/coda-agent run ")
            and main_job.endswith("# main job"))
    assert tests.startswith("bash scripts/setup.sh && .venv/bin/python -m pytest") and "not api" in tests
    commands = tour_commands(readme)
    assert commands[0].startswith("source .venv/bin/activate")
    assert all(c.startswith("coda-agent ") for c in commands[1:]), commands
    assert "coda-agent view --export" in readme and " --runs-dir examples/runs" in readme


def test_the_readme_tour_runs_as_typed(tmp_path):
    commands = tour_commands((REPO / "README.md").read_text())
    clone = fresh_clone(tmp_path)
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY")
           and not k.startswith(("CODA_AGENT_RUNS", "CODA_AGENT_BENCH", "CODA_AGENT_MODEL"))}
    env.update(CODA_AGENT_NO_REAL_API="1", PYTHONPATH=str(REPO), COLUMNS="160")
    # One shell, as a user types it; each command announced, so a failure names its line.
    script = (["set -eo pipefail"] + [f"echo {('::tour:: ' + c)!r}\n{c}" for c in commands]
              + ["echo '::tour:: done'"])
    started = time.monotonic()
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=300)
    seconds = time.monotonic() - started
    out = proc.stdout + proc.stderr
    ran = [
        line.removeprefix("::tour:: ") for line in proc.stdout.splitlines() if line.startswith("::tour:: ")]
    assert (proc.returncode == 0
            and ran[-1] == "done"), f"the tour stopped at: {ran[-1] if ran else '?'}\n{out[-4000:]}"
    assert ran[:-1] == commands
    assert "PASSED gemm_residual_rmsnorm" in out and "PASSED gemm_swiglu" in out
    assert "manual" in out  # the shipped model-written records are listed
    assert (clone / "site" / "index.html").is_file()
    assert seconds < 120, f"the tour took {seconds:.0f} s; the README says 22 s"
