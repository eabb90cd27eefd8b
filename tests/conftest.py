"""Shared fixtures. GPU tests (marker ``gpu``) skip without a CUDA device; ``api`` tests never run in CI."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from coda_agent.cli import main
from coda_agent.providers.mock import EXAMPLE_DIR
from coda_agent.tasks.loader import BUILTIN_TASK_DIR

REPO = Path(__file__).resolve().parents[1]
TASK_DIR = BUILTIN_TASK_DIR
EXAMPLE_SCRIPT = EXAMPLE_DIR / "gemm_residual_three_attempts.yaml"

# Never let a test reach a real LLM API, whatever the environment holds.
os.environ.setdefault("CODA_AGENT_NO_REAL_API", "1")
# A Ray cluster a test starts stays on 127.0.0.1 (Ray reads this when it is first imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _quack_cache() -> Iterator[None]:
    """Compile-only tests share one QuACK cache per session (compiles are keyed, so this is safe). It is not
    under pytest's own temporary folder, which is closed to other users: runners as nobody must reach it."""
    if "QUACK_CACHE_DIR" in os.environ:
        yield
        return
    with runner_folder("coda_test_quack_") as cache:
        os.environ["QUACK_CACHE_DIR"] = str(cache)
        yield
        del os.environ["QUACK_CACHE_DIR"]


@contextlib.contextmanager
def runner_folder(prefix: str) -> Iterator[Path]:
    """A folder a runner may be given whatever user it runs as (as the checker's own are: in the system's
    temporary folder, others may pass through but not list it), removed after."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A runner's scratch folder for tests that start runners by hand (``tmp_path`` is closed to other
    users)."""
    with runner_folder("coda_test_scratch_") as folder:
        yield folder / "scratch"


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test writes run records into the repository, reads its committed bench results or uses the user's
    tuning cache by accident."""
    base = tmp_path_factory.mktemp("store")
    monkeypatch.setenv("CODA_AGENT_RUNS_DIR", str(base / "runs"))
    monkeypatch.setenv("CODA_AGENT_BENCH_DIR", str(base / "bench"))
    monkeypatch.setenv("CODA_AGENT_CACHE_DIR", str(base / "cache"))


@pytest.fixture(autouse=True)
def _output_to_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees output as a user's pipe does: pytest-xdist's workers set COLUMNS=80, which the commands
    honour (tests of the width set it themselves)."""
    monkeypatch.delenv("COLUMNS", raising=False)


def invoke(*args: str) -> int:
    """Run the real entry point in-process (one-line errors included); returns its exit code."""
    saved = sys.argv
    sys.argv = ["coda-agent", *args]
    try:
        main()
        return 0
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = saved


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the real entry point in-process: (exit code, stdout, stderr)."""
    code = invoke(*args)
    out, err = capsys.readouterr()
    return code, out, err


@dataclass
class EscapeBait:
    """What an escaping candidate goes for: a planted key, a sentinel file, a loopback listener (and its
    source)."""

    key: str
    sentinel: Path
    listener: socket.socket
    source: str

    def reached(self) -> bool:
        """Did anything connect to the listener?"""
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return False
        conn.close()
        return True


@pytest.fixture
def escape_bait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EscapeBait]:
    """tests/candidates/k0_escape_template.py aimed at this test's key, sentinel and listener."""
    key = f"sk-ant-FAKE-{os.getpid()}-{tmp_path.name}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("original")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    template = (REPO / "tests" / "candidates" / "k0_escape_template.py").read_text()
    source = template.replace("SENTINEL", repr(str(sentinel))).replace("PORT", str(listener.getsockname()[1]))
    yield EscapeBait(key, sentinel, listener, source)
    listener.close()


class Processes:
    """The host's process table, read from /proc (a sandboxed process shows there with its host pid)."""

    @staticmethod
    def _stat(pid: int) -> list[str]:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()

    def descendants(self, pid: int) -> set[int]:
        """Every process below ``pid``."""
        parents: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    parents[int(d.name)] = int(self._stat(int(d.name))[1])
                except (OSError, ValueError, IndexError):
                    continue
        found, frontier = set(), {pid}
        while frontier:
            frontier = {p for p, pp in parents.items() if pp in frontier} - found
            found |= frontier
        return found

    def alive(self, pid: int) -> bool:
        try:
            return self._stat(pid)[0] not in ("Z", "X")
        except (OSError, IndexError):
            return False

    def cmdline(self, pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""


@pytest.fixture
def procs() -> Processes:
    return Processes()
