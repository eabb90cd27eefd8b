"""The OS sandbox the candidate runner lives in: bubblewrap namespaces, an unprivileged user, rlimits.

With bubblewrap (``bwrap`` on the PATH, or ``CODA_AGENT_BWRAP``) the runner gets its own PID, network,
IPC, UTS and mount namespaces: it cannot see the agent or the checker (``/proc`` is its own), has no
network, sees the filesystem read-only except its scratch folder, a private ``/tmp`` and ``/dev/shm`` (both
sized), and the QuACK cache of its own source, and does not see task folders, the run store or the home
folder. bubblewrap's ``--die-with-parent`` and the PID namespace end every process the runner started when the
checker ends it, detached or not.

A runner is never host root: when the checker runs as root, runners run as ``nobody``, and where ``nobody``
cannot read what a runner needs (a Python under ``/root``), no runner starts (:attr:`Sandbox.refused` says why
and what to do). The checker does no root work below a runner's folders: it gives a runner a folder it made
(the folder itself, never what it holds) and removes what runners wrote through folder handles
(:func:`.scratch.remove_tree`).

Without bubblewrap the runner is a plain child process (own session, cleared environment, rlimits, as
``nobody`` under root): enough against accidents, not against a determined candidate (a process that leaves
its session outlives the check). That mode is reported loudly and real-API agent runs refuse it unless the
user opts in.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import shutil
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

NOBODY = 65534
#: Environment variables the runner inherits (values only from this allowlist; never a secret).
#: ``TEARDOWN_CUPTI`` (Kineto: finalize CUPTI when a profiler stops) is a measurement setting: unset, CUPTI
#: stays attached after the runner's first traced batch (bench/README.md, "Rows still short": the host-bound
#: rows).
PASS_ENV = (
    "PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
    "QUACK_ARCH", "CUTE_DSL_ARCH", "QUACK_COMPILE_WORKERS", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE", "MKL_NUM_THREADS", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "TEARDOWN_CUPTI",
)
UNSANDBOXED_OPT_IN = "CODA_AGENT_ALLOW_UNSANDBOXED"
#: The probe: can the sandboxed user read the interpreter, the package and every Python path? (It names what
#: not.)
_READABLE = ("import os,sys; bad=[p for p in sys.argv[1:] if not os.access(p, os.R_OK | os.X_OK)]; "
             "print(*bad, sep='\\n'); sys.exit(3 if bad else 0)")

Kind = Literal["bwrap", "process"]


def host_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _share_of_host(most: int, fraction: float) -> int:
    """``most``, or ``fraction`` of the host's memory where that is less: a runner's bounds follow the
    machine."""
    return min(most, int(host_memory() * fraction))


@dataclass(frozen=True)
class Limits:
    """Resource limits of one runner, each bounded by what the host has."""

    cpu_seconds: int = 3600
    #: Address space: 16 GiB, or half the host's memory where that is less; None on a GPU (CUDA reserves huge
    #: ranges of address space).
    memory_bytes: int | None = field(default_factory=lambda: _share_of_host(16 * 1024**3, 0.5))
    processes: int = 2048  # threads count too (torch, CUDA and QuACK's compile pool start many)
    open_files: int = 4096
    file_bytes: int = 32 * 1024**3
    #: The private /tmp and /dev/shm (tmpfs: host memory no rlimit counts), each: 2 GiB or an eighth of the
    #: host's.
    tmpfs_bytes: int = field(default_factory=lambda: _share_of_host(2 * 1024**3, 0.125))


@dataclass(frozen=True)
class Spec:
    """What one runner may touch."""

    scratch: Path
    writable: tuple[Path, ...] = ()
    #: Folders of the checker's the runner reads and may not write (bound read-only even under /tmp).
    readable: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    gpu: bool = False
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = Limits()


@dataclass(frozen=True)
class Sandbox:
    """How runners are isolated on this machine; ``kind`` is ``bwrap`` or, weaker, ``process``."""

    kind: Kind
    bwrap: str | None = None
    as_nobody: bool = False
    note: str = ""
    #: Why no runner may start here (one line, with what to do), or "": as root, runners that ``nobody`` could
    #: not run would run as host root.
    refused: str = ""

    @property
    def isolated(self) -> bool:
        return self.kind == "bwrap" and not self.refused

    @property
    def runner_uid(self) -> int:
        """The user the runners run as (a folder a runner made before is theirs, not another user's)."""
        return NOBODY if self.as_nobody else os.geteuid()

    @property
    def runner_user(self) -> str:
        """Who the runners are, as a verdict records it."""
        return "nobody" if self.as_nobody else f"uid {os.geteuid()}"

    def describe(self) -> str:
        if self.refused:
            return self.refused
        if self.isolated:
            who = "as nobody" if self.as_nobody else "as this user"
            why = f"; runners not as nobody: {self.note}" if self.note else ""
            return (f"bubblewrap sandbox ({self.bwrap}, {who}: own PID/net/mount namespaces, read-only "
                    f"filesystem){why}")
        return f"NO OS sandbox ({self.note}): candidates run as plain child processes"

    def popen(self, argv: list[str], spec: Spec, prefix: list[str] = (),  # type: ignore[assignment]
              **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the sandbox described by ``spec``; ``prefix`` (the rlimit shim) runs first.

        No ``preexec_fn``: the checker runs in threads, where forking into Python code can deadlock.
        """
        if self.refused:
            raise SandboxUnavailable(self.refused)
        if os.geteuid() == 0 and not self.as_nobody:
            raise SandboxUnavailable("a runner never runs as root: this sandbox would run it so")
        env = runner_env(spec)
        for p in (spec.scratch, *spec.writable):
            p.mkdir(mode=0o700, parents=True, exist_ok=True)
            # A folder an earlier runner of this checker left is that runner's user's (nobody's, under root).
            check_private(p, runner_uid=self.runner_uid)
            if self.as_nobody:
                check_reachable(p)
            p.chmod(0o700)  # the runner's folders are its own and the checker's, no other user's
            if self.as_nobody:
                hand_over(p, self.runner_uid)
        cmd = self._bwrap_argv(argv, spec, env) if self.kind == "bwrap" else argv
        user = dict(user=NOBODY, group=NOBODY, extra_groups=[]) if self.as_nobody else {}
        return subprocess.Popen(  # type: ignore[call-overload]
            [*prefix, *cmd], env=env if self.kind == "process" else _bwrap_own_env(), cwd=spec.scratch,
            start_new_session=True, close_fds=True, **user, **kwargs,
        )

    def _bwrap_argv(self, argv: list[str], spec: Spec, env: dict[str, str]) -> list[str]:
        assert self.bwrap is not None
        size = str(spec.limits.tmpfs_bytes)
        cmd = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/",
               "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--proc", "/proc", "--size", size,
               "--tmpfs", "/tmp"]
        for keep in _needed_under_tmp():
            cmd += ["--ro-bind", keep, keep]
        for folder in (spec.scratch, *spec.writable):
            cmd += ["--bind", str(folder), str(folder)]
        for folder in spec.readable:
            cmd += ["--ro-bind", str(folder), str(folder)]
        if spec.gpu:
            for node in sorted(glob.glob("/dev/nvidia*")):
                cmd += ["--dev-bind", node, node]
        needed = [n.resolve() for n in _needed_paths(spec)]
        for h in spec.hidden:
            cmd += _hide(h, needed)
        cmd += ["--clearenv"]
        for k, v in env.items():
            cmd += ["--setenv", k, v]
        return [*cmd, "--chdir", str(spec.scratch), "--", *argv]


class UnsafeFolder(Exception):
    """A folder the runner would write is one another user could swap, fill or read, or one it cannot
    reach."""


def check_reachable(folder: Path) -> None:
    """Refuse a folder that a runner as ``nobody`` could not reach (bubblewrap would fail to bind it, and the
    runner die with no word of why): every folder above it must let other users pass (``o+x``)."""
    for p in folder.resolve().parents:
        if not os.stat(p).st_mode & stat.S_IXOTH:
            raise UnsafeFolder(f"the runners run as nobody and cannot reach {folder}: {p} is closed to other "
                               f"users (chmod o+x {p}, or choose a folder under /tmp)")


def check_private(folder: Path, runner_uid: int | None = None) -> None:
    """Refuse to give a runner ``folder`` unless it and every folder above it, up to a sticky one such as
    /tmp, is a real folder of this user (or root) that no other user may write: otherwise another user could
    swap in what the runner reads back (a planted compile cache, a replaced candidate) or what the checker
    writes through.

    ``folder`` itself may also be ``runner_uid``'s: a runner as ``nobody`` leaves the QuACK cache of its
    source owned by nobody, and the next runner over the same source gets it back (the folders above stay
    ours)."""
    me = os.geteuid()
    leaf = folder.resolve()
    for p in (leaf, *leaf.parents):
        info = os.lstat(p)
        runners = p == leaf and runner_uid is not None and info.st_uid == runner_uid
        if not stat.S_ISDIR(info.st_mode) or not (info.st_uid in (me, 0) or runners):
            raise UnsafeFolder(f"{p} belongs to another user (uid {info.st_uid}): the runner will not write "
                               "below it")
        if info.st_mode & stat.S_ISVTX:
            return
        # ours or the runner's, left open: close it
        if info.st_mode & 0o022 and (info.st_uid == me or runners):
            os.chmod(p, stat.S_IMODE(info.st_mode) & ~0o022)
        elif info.st_mode & 0o022:
            raise UnsafeFolder(f"{p} is writable by other users: the runner will not write below it")


def hand_over(folder: Path, uid: int) -> None:
    """Make the folder the checker made for a runner ``uid``'s: the folder itself, never what it holds (a
    runner may have swapped anything below it for a link; what a runner wrote there is its user's already).
    Its parent is the checker's and closed to others (:func:`check_private`), so the folder cannot be swapped
    itself."""
    if os.lstat(folder).st_uid != uid:
        os.lchown(folder, uid, uid)


def python_path() -> list[str]:
    """The checker's Python paths a runner needs: every existing ``sys.path`` folder except the one Python put
    first for the checker itself (its script's folder, or the working folder under ``python -m``) and the
    working folder, which the runner never imports from (unless the package lives there). One closed to other
    users would otherwise stop every runner as nobody."""
    own = {os.path.realpath(os.getcwd())}
    if sys.path and sys.path[0] and not sys.flags.safe_path:
        own.add(os.path.realpath(sys.path[0]))
    keep = str(PACKAGE.parent)
    return [p for p in dict.fromkeys(sys.path)
            if p and os.path.isdir(p) and (os.path.realpath(p) not in own or os.path.realpath(p) == keep)]


def runner_env(spec: Spec) -> dict[str, str]:
    """The runner's whole environment: an allowlist of the checker's, plus where it may write."""
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env.update({
        "HOME": str(spec.scratch), "TMPDIR": "/tmp", "XDG_CACHE_HOME": str(spec.scratch / ".cache"),
        "TRITON_CACHE_DIR": str(spec.scratch / ".triton"), "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(python_path()),
    })
    env.update(spec.env)
    return env


def _bwrap_own_env() -> dict[str, str]:
    """bubblewrap itself is PID 1 of the namespace and its environ is readable there: give it nothing."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _hide(path: Path, needed: list[Path], depth: int = 2) -> list[str]:
    """bwrap arguments that make ``path`` invisible, except the parts of it the runner needs to run."""
    try:
        real = path.resolve()
        if not real.exists() or real in needed:
            return []
        if not any(n.is_relative_to(real) for n in needed):
            return ["--tmpfs", str(real)] if real.is_dir() else ["--ro-bind", "/dev/null", str(real)]
        if depth == 0 or not real.is_dir():
            return []
        return [arg for child in sorted(real.iterdir()) for arg in _hide(child, needed, depth - 1)]
    except OSError:
        return []


#: The coda_agent package folder: an editable install imports it from where the checkout is, not from
#: sys.path.
PACKAGE = Path(__file__).resolve().parents[1]


def _needed_paths(spec: Spec) -> list[Path]:
    """What the runner reads or writes: the interpreter, the package, Python's paths, its folders."""
    return [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent, PACKAGE,
            spec.scratch, *spec.writable, *spec.readable, *(Path(p) for p in python_path())]


def _needed_under_tmp() -> list[str]:
    """What the runner reads that lives under /tmp (the GPU machine's site-packages, a virtualenv or an
    editable checkout there) survives the private /tmp."""
    out: list[str] = []
    for p in sorted({sys.prefix, str(PACKAGE), *python_path()}):
        if p and p.startswith("/tmp/") and os.path.isdir(p) and not any(p.startswith(q + "/") for q in out):
            out.append(p)
    return out


def kill(proc: subprocess.Popen[bytes]) -> None:
    """End the runner and everything in its session (with bubblewrap, its whole PID namespace)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@functools.cache
def detect() -> Sandbox:
    """The strongest sandbox that works here, probed once per process by starting the runner's Python inside
    it (as ``nobody`` when this is root: never as root)."""
    as_nobody = os.geteuid() == 0
    who = "nobody" if as_nobody else "this user"
    user = dict(user=NOBODY, group=NOBODY, extra_groups=[]) if as_nobody else {}
    readable = [str(p) for p in _needed_paths(Spec(scratch=Path("/")))]
    python = [sys.executable, "-S", "-c", _READABLE, *readable]
    bwrap = os.environ.get("CODA_AGENT_BWRAP") or shutil.which("bwrap")
    if bwrap:
        binds = [arg for keep in _needed_under_tmp() for arg in ("--ro-bind", keep, keep)]
        probe = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
                 "--proc", "/proc", "--tmpfs", "/tmp", *binds, "--", *python]
        failure = _probe(probe, user, who)
        if failure is None:
            return Sandbox("bwrap", bwrap=bwrap, as_nobody=as_nobody)
        note = f"bubblewrap is installed but no runner could start in it: {failure}"
    else:
        note = "bubblewrap is not installed: apt-get install bubblewrap"
    if as_nobody:  # a plain child process, as nobody too, or none at all
        failure = _probe(python, user, who)
        if failure is not None:
            return Sandbox("process", note=note, refused=(
                f"no runner can start: the checker runs as root, runners run as nobody, and {failure}; or "
                "run coda-agent as a user other than root"))
    return Sandbox("process", as_nobody=as_nobody, note=note)


def _probe(argv: list[str], user: dict[str, Any], who: str) -> str | None:
    """Start the probe; None when the runner's Python could read all it needs, else why not."""
    try:
        res = subprocess.run(argv, capture_output=True, timeout=20, env=_bwrap_own_env(), **user)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{who} cannot start it: {exc}"
    return None if res.returncode == 0 else _probe_failure(res, who)


def _probe_failure(res: subprocess.CompletedProcess[bytes], who: str) -> str:
    """Why the probe failed, naming its cause: paths the user cannot read inside, or bubblewrap's own
    error."""
    unreadable = ("a folder above it is closed to that user: open it with chmod o+x, or put Python and the "
                  "checkout where that user can read")
    if res.returncode == 3:
        paths = res.stdout.decode(errors="replace").split()
        return f"{who} cannot read {', '.join(paths[:3])} inside the sandbox ({unreadable})"
    detail = res.stderr.decode(errors="replace").strip()[:200] or f"exit {res.returncode}"
    if "Permission denied" in detail and "execvp" in detail:
        return f"{who} cannot run Python inside the sandbox: {detail} ({unreadable})"
    return f"bubblewrap cannot create namespaces here as {who} ({detail})"


class SandboxUnavailable(Exception):
    """Candidates would run without an OS sandbox and the user has not opted in."""


def require_isolation(purpose: str) -> Sandbox:
    """The sandbox, or :class:`SandboxUnavailable` when no runner may start, or when there is no OS sandbox
    and ``CODA_AGENT_ALLOW_UNSANDBOXED`` is unset."""
    box = detect()
    if box.refused:
        raise SandboxUnavailable(box.refused)
    if not box.isolated and os.environ.get(UNSANDBOXED_OPT_IN, "") in ("", "0"):
        raise SandboxUnavailable(
            f"{purpose} runs model-written code, and this machine has {box.describe()}; install bubblewrap "
            f"(apt-get install bubblewrap) or set {UNSANDBOXED_OPT_IN}=1 to run without an OS sandbox"
        )
    return box
