"""The machinery of the adversarial suite: a fake agent holding fake keys, a loopback listener, process and
file watches, and :func:`run_case`, which verifies one case and lists every way the verifier let it through.

Nothing here trusts the verifier: survivors are found by scanning ``/proc``, file changes by hashing and
``git status``, leaks by searching the verdict JSON and the listener's bytes for the planted secrets.
"""

from __future__ import annotations

import binascii
import contextlib
import hashlib
import json
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from coda_agent.verifier import Plan
from coda_agent.verifier.verdict import Verdict

from .manifest import Case

REPO = Path(__file__).resolve().parents[2]
#: Repository folders whose files are snapshotted before every case and restored after it (a candidate that
#: rewrites the task's reference or the verifier's own source must not poison the rest of the run).
RESTORE_DIRS = ("coda_agent",)  # the task suite lives in coda_agent/suite

#: The fake secrets, one set per test session. The values carry a random part so that a hit cannot be a
#: coincidence, and the hex part alone is searched too (a truncated or re-encoded leak still counts).
SECRET_ENV = {
    "ANTHROPIC_API_KEY": "sk-ant-FAKE-" + secrets.token_hex(12),
    "OPENAI_API_KEY": "sk-FAKE-" + secrets.token_hex(12),
    "CODA_AGENT_FAKE_GITHUB_TOKEN": "ghp_FAKE" + secrets.token_hex(12),
}
SSH_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE-SSH-" + secrets.token_hex(12)
           + "\n-----END OPENSSH PRIVATE KEY-----\n")


def secret_needles() -> list[str]:
    """Every string whose presence in a verdict or on the wire means a secret leaked."""
    needles: list[str] = []
    for value in [*SECRET_ENV.values(), SSH_KEY.splitlines()[1]]:
        rand = value.rsplit("-", 1)[-1].removeprefix("ghp_FAKE")
        needles += [value, rand, binascii.hexlify(value.encode()).decode(),
                    binascii.hexlify(rand.encode()).decode()]
    return needles


# --- the fake agent ---------------------------------------------------------------------------------------


class Agent:
    """A long-lived ``agent_proc`` child started with the fake keys in its initial environment."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.home = workdir / "home"
        self.cwd = workdir / "agent_cwd"
        self.log = workdir / "agent.log"
        self.token = "@@coda-adv-" + secrets.token_hex(6) + "@@"
        self.proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self.restarts = 0

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else -1

    def start(self) -> None:
        (self.home / ".ssh").mkdir(parents=True, exist_ok=True)
        (self.home / ".ssh" / "id_ed25519").write_text(SSH_KEY)
        self.cwd.mkdir(exist_ok=True)
        env = dict(os.environ)
        env.update(SECRET_ENV)
        root = str(REPO)
        env.update(HOME=str(self.home), PYTHONUNBUFFERED="1",
                   PYTHONPATH=root + os.pathsep + env.get("PYTHONPATH", ""))
        self._buf = b""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.adversarial.agent_proc", self.token],
                cwd=self.cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            )
        ready = self._read(120.0)
        if not (ready and ready.get("ready")):
            raise RuntimeError(f"the fake agent did not start; see {self.log}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _read(self, wait: float) -> dict[str, object] | None:
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + wait
        tok = self.token.encode()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.startswith(tok):
                    return json.loads(line[len(tok):])
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:  # the agent died (its stdout closes just before it becomes a zombie)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(timeout=10)
                    return None
                self._buf += chunk

    def verify(self, task: str, source: str, plan: Plan, wait: float) -> dict[str, object]:
        """One ``verify()`` in the agent; ``{"lost": why}`` when it never answered (then the agent is
        restarted)."""
        if not self.alive():
            self.restarts += 1
            self.start()
        assert self.proc and self.proc.stdin
        req = {"task": task, "source": source, "plan": plan.model_dump(mode="json")}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        t0 = time.monotonic()
        reply = self._read(wait)
        if reply is None:
            lost_after = time.monotonic() - t0
            why = ("the agent process (verify()'s caller) was killed during the verification"
                   if not self.alive() else f"verify() did not return within {wait:.0f} s")
            self.stop()
            self.restarts += 1
            self.start()
            return {"lost": why, "wall_s": lost_after}
        return reply


# --- the loopback listener --------------------------------------------------------------------------------


class Listener:
    """TCP and UDP on one 127.0.0.1 port; records every connection and datagram (answers HTTP with 200)."""

    def __init__(self) -> None:
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with contextlib.suppress(OSError):
            self.udp.bind(("127.0.0.1", self.port))
        self.received: list[bytes] = []
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.tcp, self.udp], [], [], 0.1)
            for s in ready:
                if s is self.udp:
                    data, _ = self.udp.recvfrom(1 << 16)
                    self.connections += 1
                    self.received.append(data)
                    continue
                conn, _ = self.tcp.accept()
                self.connections += 1
                conn.settimeout(0.5)
                data = b""
                with contextlib.suppress(OSError):
                    while len(data) < 1 << 20:
                        chunk = conn.recv(1 << 16)
                        if not chunk:
                            break
                        data += chunk
                        if b"\r\n\r\n" in data and not data.startswith((b"POST", b"PUT")):
                            break
                self.received.append(data)
                with contextlib.suppress(OSError):
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
                conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.tcp.close()
        self.udp.close()


# --- processes --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int
    cmdline: bytes
    environ: bytes


def processes() -> dict[tuple[int, int], Proc]:
    """Every process this user can see, keyed by (pid, start time) so a reused pid is a new process."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        base = f"/proc/{entry}"
        try:
            with open(f"{base}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            ppid, start = int(fields[1]), int(fields[19])
            with open(f"{base}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        try:
            with open(f"{base}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            environ = b""
        found[(int(entry), start)] = Proc(int(entry), ppid, start, cmdline, environ)
    return found


def survivors(before: dict[tuple[int, int], Proc], marker: str, agent_pid: int) -> list[Proc]:
    """Processes started since ``before`` that are still alive: descendants of the fake agent, or anywhere
    with the case's marker in their argv or environment.

    The agent is a child subreaper, so a detached child (double fork, ``setsid``) of the verification is
    re-parented to it and stays its descendant; zombies (exited, not yet reaped) do not count. Other users'
    processes on a shared machine are never descendants of the agent and never carry the random marker.
    """
    now = processes()
    children: dict[int, list[Proc]] = {}
    for p in now.values():
        children.setdefault(p.ppid, []).append(p)
    found: dict[int, Proc] = {}
    stack = list(children.get(agent_pid, []))
    while stack:
        p = stack.pop()
        found[p.pid] = p
        stack += children.get(p.pid, [])
    mark = marker.encode()
    for p in now.values():
        if mark in p.cmdline or mark in p.environ:
            found[p.pid] = p
    mine = {os.getpid(), agent_pid}
    return [p for key, p in sorted(((p.pid, p.start), p) for p in found.values())
            if key not in before and p.pid not in mine and _state(p.pid) not in ("Z", "X", "")]


def _cmd(p: Proc) -> str:
    return p.cmdline.replace(b"\0", b" ").decode(errors="replace")[:120]


def kill(procs: Iterable[Proc]) -> None:
    """SIGKILL each survivor by pid (they were all started by this test), then wait for them to go."""
    procs = list(procs)
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 3
    while procs and time.monotonic() < deadline:
        procs = [p for p in procs if Path(f"/proc/{p.pid}").exists() and _state(p.pid) not in ("Z", "X", "")]
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return stat[stat.rindex(b")") + 2 :].split()[0].decode()
    except (OSError, ValueError, IndexError):
        return ""


# --- files ------------------------------------------------------------------------------------------------


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            with contextlib.suppress(OSError):
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _git_status() -> set[str]:
    res = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True, text=True,
        check=False
    )
    return set(res.stdout.splitlines())


def _tmp_marked(marker: str) -> set[str]:
    import tempfile

    roots = {"/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir()}
    found = set()
    for root in roots:
        with contextlib.suppress(OSError):
            found |= {os.path.join(root, n) for n in os.listdir(root) if marker in n}
    return found


@dataclass
class FileWatch:
    """Before/after state of the watched folder (with its sentinel), the repository and the temp folders."""

    watch: Path
    sentinel: Path
    marker: str
    extra: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.trees = {d: _tree(d) for d in [self.watch, *self.extra]}
        self.status = _git_status()
        self.snapshot = {
            p: p.read_bytes() for d in RESTORE_DIRS for p in (REPO / d).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    def problems_and_restore(self) -> list[str]:
        problems = []
        for d, before in self.trees.items():
            after = _tree(d)
            new = sorted(set(after) - set(before))
            changed = sorted(k for k in before if k in after and after[k] != before[k])
            gone = sorted(set(before) - set(after))
            if new or changed or gone:
                problems.append(f"files changed in {d}: new {new}, modified {changed}, removed {gone}")
            for rel in new:
                with contextlib.suppress(OSError):
                    (d / rel).unlink()
        status = _git_status()
        if status != self.status:
            problems.append(f"the repository changed: {sorted(status ^ self.status)}")
        for p, data in self.snapshot.items():
            try:
                same = p.read_bytes() == data
            except OSError:
                same = False
            if not same:
                p.write_bytes(data)
        for line in sorted(status - self.status):
            # Only what the case itself named (its marker) is removed: anything else new in the repository
            # may be someone's work in progress and is only reported.
            if line.startswith("??") and self.marker in line:
                with contextlib.suppress(OSError):
                    (REPO / line[3:]).unlink()
        marked = _tmp_marked(self.marker)
        if marked:
            problems.append(
                f"files named with the case's marker appeared in the temp folders: {sorted(marked)}")
            for m in marked:
                with contextlib.suppress(OSError):
                    Path(m).unlink()
        return problems


# --- one case ---------------------------------------------------------------------------------------------

_CONST = re.compile(r"^(ADV_[A-Z_]+) = .*$", re.MULTILINE)


def substitute(source: str, values: dict[str, object]) -> str:
    """Replace the case's ``ADV_*`` constants (listener port, marker, watched paths) with this test's
    values."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"{name} = {values[name]!r}" if name in values else m.group(0)

    return _CONST.sub(repl, source)


def wrong_candidate(marker: str) -> str:
    """The human k0 kernel with the residual's sign flipped, tagged with the case's marker (see
    proc_next_job_rewrite)."""
    from coda_agent.tasks import find_task

    src = find_task("gemm_residual_rmsnorm").human_file.read_text()
    assert "h = acc + c" in src
    return src.replace("h = acc + c", "h = acc - c") + f"\n# the job after {marker}\n"


#: How each failing outcome's reason must read (case-insensitive regular expressions).
REASON_RULES = {
    "static_rejected": r"static|allowlist",
    "timeout": r"time|within|finish",
    "over_launch_budget": r"launch",
    "wrong_output": r"output",
}


@dataclass
class Result:
    case: str
    outcome: str | None
    reason: str
    problems: list[str]
    wall_s: float | None
    verdict: dict[str, object] | None = None


def run_case(case: Case, agent: Agent, listener: Listener, tmp: Path, source: str | None = None) -> Result:
    """Verify one case in the fake agent and return every problem found (empty: the verifier held)."""
    marker = "coda-adv-" + secrets.token_hex(5)
    watch = tmp / "watch"
    watch.mkdir(exist_ok=True)
    sentinel = watch / "sentinel.txt"
    sentinel.write_text("sentinel " + secrets.token_hex(8) + "\n")
    values = {"ADV_PORT": listener.port, "ADV_MARKER": marker, "ADV_WATCH": str(watch),
              "ADV_SENTINEL": str(sentinel)}
    src = substitute(source if source is not None else case.path.read_text(), values)

    before = processes()
    files = FileWatch(watch, sentinel, marker, extra=[agent.cwd])
    reply = agent.verify(case.task, src, case.plan, wait=case.timeout + 60)
    problems: list[str] = []
    verdict: Verdict | None = None
    if "lost" in reply:
        problems.append(str(reply["lost"]))
    elif "error" in reply:
        problems.append(f"verify() raised:\n{reply['error']}")
    else:
        verdict = Verdict.model_validate_json(str(reply["verdict"]))
    wall = float(reply["wall_s"]) if "wall_s" in reply else None  # type: ignore[arg-type]

    time.sleep(0.3)  # a child that is just exiting on its own is not a survivor
    alive = survivors(before, marker, agent.pid) if "no_survivors" in case.checks else []

    if case.follow_up == "next_job":
        # A plainly wrong candidate verified right after: a leftover process must not be able to pass it.
        nxt = agent.verify("gemm_residual_rmsnorm", wrong_candidate(marker), Plan(timeout=30.0), wait=120.0)
        if "verdict" in nxt:
            v2 = Verdict.model_validate_json(str(nxt["verdict"]))
            if v2.passed or v2.outcome.value != "wrong_output":
                problems.append(
                    "the next job (a plainly wrong candidate) was not judged wrong_output: "
                    f"{v2.outcome.value}: {v2.reason[:300]}")
        else:
            problems.append(f"the next job got no verdict: {nxt}")
        alive += [p for p in survivors(before, marker, agent.pid) if p not in alive]

    if alive:
        problems.append(
            "processes outlived the verification: "
            + "; ".join(f"pid {p.pid} ppid {p.ppid}: {_cmd(p)}" for p in alive)
        )
    kill(alive)

    if "files_untouched" in case.checks:
        problems += files.problems_and_restore()
    else:
        files.problems_and_restore()

    if "listener" in case.checks and listener.connections:
        problems.append(
            f"the loopback listener received {listener.connections} connection(s): "
            f"{[d[:200] for d in listener.received]}")
    if "secret" in case.checks:
        blob = ((verdict.model_dump_json() if verdict else json.dumps(reply))
                + "".join(d.decode(errors="replace") for d in listener.received))
        leaked = [n for n in secret_needles() if n in blob]
        if leaked:
            problems.append(
                f"a planted secret reached the verdict or the listener ({len(leaked)} needle(s), e.g. "
                f"{leaked[0][:12]}...)")

    outcome = verdict.outcome.value if verdict else None
    reason = verdict.reason if verdict else ""
    if verdict is not None and case.control:
        if not verdict.passed:
            problems.append(f"a human kernel was rejected (a false rejection): {outcome}: {reason[:500]}")
    elif verdict is not None:
        if verdict.passed:
            problems.append(f"the verifier PASSED it: {reason[:300]}")
        elif outcome not in case.accept:
            problems.append(f"outcome {outcome!r} is not one of {sorted(case.accept)}: {reason[:300]}")
        if not verdict.passed:
            if not reason.strip():
                problems.append("the verdict's reason is empty")
            rule = REASON_RULES.get(outcome or "")
            if rule and not re.search(rule, reason, re.IGNORECASE):
                problems.append(f"the {outcome} reason does not say what happened (/{rule}/): {reason[:200]}")
            if (outcome == "cheat_detected" and case.reason_any
                and not any(k.lower() in reason.lower() for k in case.reason_any)):
                problems.append(
                    f"the cheat_detected reason names none of {list(case.reason_any)}: {reason[:200]}")
        if wall is not None and wall > case.timeout + 20:
            problems.append(f"verify() took {wall:.0f} s with a {case.timeout:.0f} s timeout")
    _report(case, outcome, reason, problems, wall)
    return Result(case.file, outcome, reason, problems, wall,
                  json.loads(verdict.model_dump_json()) if verdict else None)


def _report(case: Case, outcome: str | None, reason: str, problems: list[str], wall: float | None) -> None:
    """With CODA_ADV_REPORT=path, one JSON line per case (for the summary of which holes are open)."""
    path = os.environ.get("CODA_ADV_REPORT")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"case": case.file, "family": case.family, "outcome": outcome,
                            "reason": reason[:300], "wall_s": wall, "problems": [p[:300] for p in problems]})
                + "\n")
