"""What every recorded figure names beside itself: package versions, the git commit, the driver, the host.

One home for the rules, used by run records and bench results alike. ``CODA_AGENT_GIT_COMMIT`` names the
commit where the tree was copied without its ``.git`` (the GPU machine).
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from . import __version__

#: Distributions whose versions a result depends on (absent ones are left out).
RECORDED_PACKAGES = ("torch", "triton", "nvidia-cutlass-dsl", "quack-kernels", "pydantic", "anthropic",
                     "openai")
COMMIT_ENV = "CODA_AGENT_GIT_COMMIT"
REPO = Path(__file__).resolve().parents[1]


def package_versions(names: tuple[str, ...] = RECORDED_PACKAGES) -> dict[str, str]:
    """Python's version, each installed package's, and coda-agent's own."""
    found = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    found["coda-agent"] = __version__
    return found


def git_state(repo: Path = REPO) -> tuple[str | None, bool]:
    """(commit, dirty): dirty when any file git does not ignore differs from HEAD, or when git cannot say;
    (None, False) when the commit is unknown."""
    named = os.environ.get(COMMIT_ENV)
    if named:
        return named.removesuffix("-dirty"), named.endswith("-dirty")

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None, False
    status = git("status", "--porcelain")
    # A tree git cannot compare with HEAD is not known to be HEAD's: a copy beside a .git of another commit
    # (the GPU machine's, 2026-12-06) must not print that commit as clean.
    return commit.strip(), status is None or bool(status.strip())


def git_commit(repo: Path = REPO) -> str | None:
    """The commit as results print it: ``<sha>`` or ``<sha>-dirty``."""
    commit, dirty = git_state(repo)
    return None if commit is None else commit + ("-dirty" if dirty else "")


def driver_version() -> str:
    """The NVIDIA driver's version, '' without one."""
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    return res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else ""


def host_name() -> str:
    return socket.gethostname()
