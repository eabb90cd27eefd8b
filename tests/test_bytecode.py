"""Runners' bytecode where the installation ships none: the checker's folder, filled by a trusted process,
read-only to runners (coda_agent/verifier/bytecode.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from coda_agent.tasks import find_task
from coda_agent.verifier import Plan, bytecode, sandbox, verify
from coda_agent.verifier.client import RunnerClient
from coda_agent.verifier.sandbox import Spec

needs_bwrap = pytest.mark.skipif(not sandbox.detect().isolated,
                                 reason="bubblewrap cannot create namespaces here")


@pytest.fixture
def no_own_bytecode(monkeypatch, scratch):
    """An installation without bytecode beside its sources, the checker's caches in a folder runners reach;
    the filling process recorded, not run."""
    monkeypatch.setenv("QUACK_CACHE_DIR", str(scratch.parent / "quack"))
    monkeypatch.setattr(bytecode, "has_own_bytecode", lambda module: False)
    filled: list[Path] = []
    started = threading.Event()
    monkeypatch.setattr(bytecode, "fill", lambda folder: (filled.append(folder), started.set()))
    bytecode.runner_prefix.cache_clear()
    yield filled, started
    bytecode.runner_prefix.cache_clear()


def test_bytecode_beside_a_modules_source_is_the_installations_own(tmp_path, monkeypatch):
    for name, compiled in (("with_pyc", True), ("without_pyc", False)):
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text("")
        if compiled:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True,
                           env={"PATH": "/usr/bin:/bin"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert bytecode.has_own_bytecode("with_pyc") and not bytecode.has_own_bytecode("without_pyc")
    assert bytecode.has_own_bytecode("no_such_module_here")  # not installed: it does not count


def test_an_installation_with_its_own_bytecode_gives_runners_no_folder(monkeypatch):
    monkeypatch.setattr(bytecode, "has_own_bytecode", lambda module: True)
    bytecode.runner_prefix.cache_clear()
    try:
        assert bytecode.runner_prefix() is None
    finally:
        bytecode.runner_prefix.cache_clear()


def test_without_it_the_checker_fills_a_folder_of_its_own_once(no_own_bytecode):
    filled, started = no_own_bytecode
    folder = bytecode.runner_prefix()
    assert folder == bytecode.cache_root() / "python" and started.wait(10)
    assert filled == [folder] and folder.stat().st_mode & 0o777 == 0o755
    assert bytecode.runner_prefix() == folder and filled == [folder]  # once per process
    (folder / bytecode._filled_marker()).touch()
    bytecode.runner_prefix.cache_clear()
    started.clear()
    assert bytecode.runner_prefix() == folder and not started.wait(0.5)  # filled before: not again


@needs_bwrap
def test_a_runner_reads_the_folder_and_cannot_write_it(no_own_bytecode, scratch):
    folder = bytecode.runner_prefix()
    assert folder is not None
    (folder / "seen").write_text("x")
    probe = ("import os, sys; print(sys.pycache_prefix == os.environ['PYTHONPYCACHEPREFIX'], "
             "os.path.exists(os.path.join(sys.pycache_prefix, 'seen')), end=' ')\n"
             "try:\n    open(os.path.join(sys.pycache_prefix, 'planted.pyc'), 'w'); print('written')\n"
             "except OSError:\n    print('refused')")
    spec = Spec(scratch=scratch, readable=(folder,), env={"PYTHONPYCACHEPREFIX": str(folder)})
    proc = sandbox.detect().popen([sys.executable, "-c", probe], spec, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert out.decode().split() == ["True", "True", "refused"], err
    assert not (folder / "planted.pyc").exists()


def test_every_runner_is_given_the_folder(no_own_bytecode, monkeypatch):
    seen: list[Spec] = []

    class Stop(Exception):
        pass

    def popen(self, argv, spec, **kwargs):
        seen.append(spec)
        raise Stop

    monkeypatch.setattr(sandbox.Sandbox, "popen", popen)
    with pytest.raises(Stop):
        RunnerClient("", backend="torch", device="cpu", constants={}, deadline=60.0)
    folder = bytecode.runner_prefix()
    assert seen[0].readable == (folder,) and seen[0].env["PYTHONPYCACHEPREFIX"] == str(folder)
    assert not seen[0].scratch.exists()  # a runner that never started leaves no folder behind


@pytest.mark.slow
def test_the_filling_process_compiles_what_a_runner_imports_and_runners_verify_from_it(monkeypatch, scratch):
    """The real process (suite kernels on the emulator and built for sm_90a), started by the first runner
    that needs the folder: torch's, the DSL's, QuACK's and the runner's own bytecode land there, the folder is
    marked filled, and a verification whose runners read it passes and adds nothing to it."""
    monkeypatch.setenv("QUACK_CACHE_DIR", str(scratch.parent / "quack"))
    monkeypatch.setattr(bytecode, "has_own_bytecode", lambda module: False)
    bytecode.runner_prefix.cache_clear()
    try:
        folder = bytecode.runner_prefix()
        assert folder is not None
        marker = folder / bytecode._filled_marker()
        deadline = time.monotonic() + 600
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(1)
        compiled = {p.name for p in folder.rglob("*.pyc")}
        tag = sys.implementation.cache_tag
        for name in ("serve", "gemm_tvm_ffi_utils", "autotuner", "eval_frame"):
            assert any(n.startswith(f"{name}.{tag}") for n in compiled), name
        task = find_task("gemm_residual")
        assert task.human_file is not None
        verdict = verify(task, task.human_file.read_text(), Plan())
        assert verdict.passed, verdict.reason
        assert {p.name for p in folder.rglob("*.pyc")} == compiled
    finally:
        bytecode.runner_prefix.cache_clear()
