"""Bytecode the checker compiles for its runners, where the installation ships none beside its sources.

A runner never writes bytecode: it may run as nobody, and its environment says ``PYTHONDONTWRITEBYTECODE``.
On an installation without ``__pycache__`` beside torch's sources (slim container images often ship so),
every runner compiled torch's, the DSL's and QuACK's source again: 5.6 s of an 11.4 s first call on the H100
(bench/notes/runner-bytecode.md). There the checker fills a folder of its own once per host and package set,
in a trusted process that walks a runner's path (its imports, then suite kernels on the emulator and built for
sm_90a with no GPU), and runners read that folder through ``PYTHONPYCACHEPREFIX``, read-only. Python checks
every file there against its source's modification time and size, so a stale one is compiled again in memory,
never run; and a runner that starts while the folder fills compiles what is not there yet, as before.

    python -m coda_agent.verifier.bytecode FOLDER   # the filling process (the checker starts it)
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from importlib import metadata
from pathlib import Path

from .caches import cache_root
from .sandbox import UnsafeFolder, check_private, check_reachable, detect

log = logging.getLogger("coda_agent.verifier")

#: The modules whose bytecode beside their sources says the installation has its own: the bulk of what a
#: runner imports (a module not installed does not count).
PROBES = ("torch", "torch._dynamo", "torch._inductor", "cutlass", "quack")
#: The suite tasks whose human kernels the filling process runs: an element-mode and a packed-mode kernel.
TASKS = ("gemm_residual_rmsnorm", "gemm_swiglu_bwd")
#: The longest the filling process may take (it compiles two kernels for sm_90a on the CPU).
FILL_TIMEOUT_S = 900.0
_PACKAGES = ("torch", "nvidia-cutlass-dsl", "quack-kernels", "coda-agent")


def has_own_bytecode(module: str) -> bool:
    """Whether ``module``'s source has its bytecode beside it (True for one not installed or without a
    source)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return True
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return True
    source = Path(spec.origin)
    return (source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc").is_file()


@functools.cache
def runner_prefix() -> Path | None:
    """The folder runners read bytecode from, or None where the installation has its own (or the folder
    cannot be made safe: said once in the log). The first call where one is needed starts filling it, in
    the background, unless this host and package set filled it before."""
    if all(has_own_bytecode(m) for m in PROBES):
        return None
    folder = cache_root() / "python"
    try:
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        check_private(folder)  # the checker's alone: no runner or other user can plant bytecode in it
        folder.chmod(0o755)  # runners as nobody read it
        if detect().as_nobody:
            check_reachable(folder)
    except (OSError, UnsafeFolder) as exc:
        log.warning("runners compile Python's source on every start: no folder for their bytecode (%s)", exc)
        return None
    if not (folder / _filled_marker()).exists():
        threading.Thread(target=fill, args=(folder,), name="runner-bytecode", daemon=True).start()
    return folder


def _filled_marker() -> str:
    """The name of the file that says this interpreter and package set filled the folder."""
    versions = []
    for name in _PACKAGES:
        try:
            versions.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name}=none")
    key = "\n".join([sys.version, sys.executable, *versions])
    return f"filled-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def fill(folder: Path) -> bool:
    """Run the filling process (module docstring) into ``folder``, which marks it filled; whether it did (not
    when another checker process is filling it now). Never raises: without the folder's bytecode, runners
    only start slower."""
    try:
        with open(folder / ".filling", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return _fill(folder)
    except OSError:  # another process fills it now, or the folder went away
        return False


def _fill(folder: Path) -> bool:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"PYTHONPYCACHEPREFIX": str(folder), "QUACK_ARCH": "90", "CUTE_DSL_ARCH": "sm_90a",
                "CUDA_VISIBLE_DEVICES": ""})
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(folder)], env=env, capture_output=True,
                              text=True, timeout=FILL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("runners' bytecode: the filling process failed (%s)", exc)
        return False
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        log.warning("runners' bytecode: the filling process ended with %d (%s)", done.returncode, tail[0])
        return False
    log.info("runners' bytecode: %s filled", folder)
    return True


def _walk_a_runners_path() -> None:
    """What a runner imports at its start and at its first calls, each suite kernel of :data:`TASKS` on the
    emulator and built for sm_90a (the environment asks for no GPU)."""
    import torch
    import torch.profiler  # the runner's traced batches

    import coda_agent.runner.serve  # noqa: F401

    from ..primitives import backend
    from ..tasks.loader import find_task, import_file

    for name in TASKS:
        task = find_task(name)
        assert task.human_file is not None
        kernel = import_file(task.human_file, f"_bytecode_{name}")
        inputs = task.make_inputs(task.shape("small")[0].dims, 0)
        for name_of_backend in ("torch", "quack-compile"):
            backend.set_backend(name_of_backend)
            with torch.no_grad():
                kernel.forward(**inputs, **task.constants)


def main(argv: list[str]) -> int:
    """The filling process: its environment (:func:`fill`) points Python's bytecode at the folder."""
    if len(argv) != 1 or sys.pycache_prefix != str(Path(argv[0])):
        print(f"usage: PYTHONPYCACHEPREFIX=FOLDER python -m {__spec__.name} FOLDER", file=sys.stderr)
        return 2
    os.nice(10)  # below the checker and its runners
    os.umask(0o022)  # folders and files runners as nobody can read, whatever the checker's umask
    # Every cache this process compiles into is a private folder of its own, made before the DSL and QuACK
    # read where theirs are: never one under the shared temporary folder (/tmp/<user>/cutlass_python_cache,
    # say), where another user could have planted one. It goes with this process (it may outlive its checker).
    work = tempfile.mkdtemp(prefix="coda_bytecode_")
    caches = {"QUACK_CACHE_DIR": "quack", "CUTE_DSL_CACHE_DIR": "dsl", "TRITON_CACHE_DIR": "triton",
              "XDG_CACHE_HOME": "cache"}
    os.environ.update({"TMPDIR": work, **{name: f"{work}/{sub}" for name, sub in caches.items()}})
    tempfile.tempdir = None  # asked again: TMPDIR
    try:
        _walk_a_runners_path()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # marked here, not by the checker: a short-lived checker (one `coda-agent verify`) may be gone by now
    (Path(argv[0]) / _filled_marker()).touch()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
