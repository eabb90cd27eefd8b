"""The runner's OS sandbox: what it hides, that it ends with its caller, and when real runs refuse to
start."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

from coda_agent.verifier import Plan, sandbox
from coda_agent.verifier.sandbox import Sandbox, SandboxUnavailable, Spec
from coda_agent.verifier.verdict import Outcome

from .conftest import REPO, TASK_DIR

needs_bwrap = pytest.mark.skipif(not sandbox.detect().isolated,
                                 reason="bubblewrap cannot create namespaces here")


def test_hidden_folders_keep_only_what_the_runner_needs(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("secret")
    (home / ".pyenv" / "bin").mkdir(parents=True)
    (home / "notes.txt").write_text("x")
    args = sandbox._hide(home, [home / ".pyenv" / "bin"])
    hidden = {args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"} | {
        args[i + 2] for i, a in enumerate(args) if a == "--ro-bind"}
    assert str((home / ".ssh").resolve()) in hidden and str((home / "notes.txt").resolve()) in hidden
    assert not any(".pyenv" in h for h in hidden)
    assert sandbox._hide(tmp_path / "tasks-elsewhere", []) == []  # missing paths need nothing


@needs_bwrap
def test_the_sandbox_sees_no_other_process_no_network_no_secret_and_a_read_only_filesystem(scratch,
                                                                                           monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-FAKE-sandbox-test")
    probe = textwrap.dedent(
        """
        import os, socket
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
        try:
            socket.create_connection(("127.0.0.1", 22), timeout=1)
            net = "connected"
        except OSError as exc:
            net = type(exc).__name__
        try:
            open("/etc/coda-probe", "w")
            ro = "writable"
        except OSError:
            ro = "read-only"
        environ = "".join(open(f"/proc/{p}/environ", errors="replace").read() for p in pids)
        print(len(pids), net, ro, "sk-ant-FAKE" in environ + str(os.environ))
        """
    )
    proc = sandbox.detect().popen([sys.executable, "-c", probe], Spec(scratch=scratch),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    count, net, ro, leaked = out.decode().split()
    assert int(count) <= 2, out  # bubblewrap's init and the probe: nothing of the host
    assert net != "connected" and ro == "read-only" and leaked == "False", (out, err)


@needs_bwrap
def test_hidden_task_files_are_empty_inside(scratch):
    listing = f"import os; print(sorted(os.listdir({str(TASK_DIR)!r})))"
    proc = sandbox.detect().popen([sys.executable, "-c", listing], Spec(scratch=scratch, hidden=(TASK_DIR,)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert out.decode().strip() == "[]"


@needs_bwrap
@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout")
def test_the_repositorys_git_objects_are_hidden_with_the_task_files(scratch):
    """`git show HEAD:<reference>` would read a hidden reference back out of the objects."""
    from coda_agent.tasks import find_task
    from coda_agent.verifier.stages import hidden_paths

    hidden = hidden_paths(find_task("gemm_residual"))
    assert (REPO / ".git").resolve() in hidden
    listing = f"import os; print(sorted(os.listdir({str(REPO / '.git')!r})))"
    proc = sandbox.detect().popen([sys.executable, "-c", listing], Spec(scratch=scratch, hidden=hidden),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert out.decode().strip() == "[]", err


def test_a_killed_caller_takes_its_runner_with_it(tmp_path, procs):
    """kill -9 of the process that called verify() leaves no runner behind (parent-death signal, PID
    namespace)."""
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent("""
        from coda_agent.tasks import find_task
        from coda_agent.verifier import Plan, verify
        task = find_task("gemm_residual_rmsnorm")
        src = task.human_file.read_text().replace("    out = gemm(", "    while True:\\n""" \
        """        pass\\n    out = gemm(")
        verify(task, src, Plan(timeout=300))
    """))
    caller = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline, below = time.monotonic() + 120, set()  # a loaded 2-core machine starts it slowly
    while time.monotonic() < deadline and len(below) < 3:  # the shim-turned-bwrap, its init, the runner
        time.sleep(0.3)
        below = procs.descendants(caller.pid)
    assert len(below) >= 3, "the runner never started"
    time.sleep(1.0)
    below = procs.descendants(caller.pid)
    os.kill(caller.pid, signal.SIGKILL)
    caller.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(procs.alive(p) for p in below):
        time.sleep(0.2)
    assert not [p for p in below if procs.alive(p)]


def test_real_runs_refuse_without_a_sandbox_unless_asked(monkeypatch):
    weak = Sandbox("process", note="bubblewrap is not installed")
    monkeypatch.setattr(sandbox, "detect", lambda: weak)
    monkeypatch.delenv(sandbox.UNSANDBOXED_OPT_IN, raising=False)
    with pytest.raises(SandboxUnavailable, match="CODA_AGENT_ALLOW_UNSANDBOXED=1"):
        sandbox.require_isolation("an agent run")
    monkeypatch.setenv(sandbox.UNSANDBOXED_OPT_IN, "1")
    assert sandbox.require_isolation("an agent run") is weak




@needs_bwrap
def test_code_past_the_static_check_still_reaches_nothing(escape_bait, procs):
    """Defence in depth: a candidate that the allowlist would refuse, run straight through the checker."""
    from coda_agent.tasks import find_task
    from coda_agent.verifier.stages import STAGES, Context

    task = find_task("gemm_residual_rmsnorm")
    before = procs.descendants(os.getpid())
    result = STAGES["correctness"](Context(task=task, source=escape_bait.source,
                                           plan=Plan(shape_names=["tiny"], seeds=[0, 1]),
                                           deadline=time.monotonic() + 120))
    assert not escape_bait.reached(), "the candidate reached a loopback listener"
    assert escape_bait.key not in result.model_dump_json()
    assert result.outcome is Outcome.PASSED, result.reason  # it computed the task; nothing of the host leaked
    assert escape_bait.sentinel.read_text() == "original" and not Path("/tmp/coda-escape-probe").exists()
    time.sleep(0.5)
    assert not [p for p in procs.descendants(os.getpid()) - before
                if procs.alive(p)], "a process outlived the verification"


def _past_the_static_check(task_name: str, payload: str, deadline_s: float = 60.0):
    """The human kernel plus ``payload`` run at import, straight through the checker (no static check)."""
    from coda_agent.tasks import find_task
    from coda_agent.verifier.stages import STAGES, Context

    task = find_task(task_name)
    source = task.human_file.read_text() + "\n" + textwrap.dedent(payload)
    t0 = time.monotonic()
    result = STAGES["correctness"](Context(task=task, source=source,
                                           plan=Plan(shape_names=["tiny"], seeds=[0, 1]),
                                           deadline=time.monotonic() + deadline_s))
    return result, time.monotonic() - t0


@needs_bwrap
def test_what_the_runner_plants_where_the_checker_writes_is_replaced_or_refused_never_waited_on():
    """A FIFO at the next input file would block an open() for writing forever: the checker removes it and
    writes its own file; a folder there, which it cannot remove, ends the check at once as a crash."""
    result, seconds = _past_the_static_check("gemm_residual",
                                             'import os as _os\n_os.mkfifo("in_tiny-1.bin")\n')
    assert result.outcome is Outcome.PASSED and seconds < 30, result.reason
    result, seconds = _past_the_static_check("gemm_residual",
                                             'import os as _os\n_os.makedirs("in_tiny-1.bin/x")\n')
    assert result.outcome is Outcome.CRASH and "tampered" in result.reason and seconds < 30, result.reason


@needs_bwrap
def test_the_checker_never_writes_or_reads_through_a_link_the_runner_plants(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    result, _ = _past_the_static_check("gemm_residual",
                                       f'import os as _os\n_os.symlink({str(victim)!r}, "in_tiny-1.bin")\n')
    assert victim.read_text() == "untouched"
    assert result.outcome is Outcome.PASSED, result.reason  # the checker replaced the link with its own file
    leak = f'''
        import sys as _sys, os as _os
        _M = _sys.modules["coda_agent.runner.serve"]  # the runner's loop (python -m coda_agent.runner)
        _orig = _M.write_tensors
        def _write(path, tensors):
            refs = _orig(path, tensors)
            if path.name.startswith("out_"):
                _os.replace(path, path.with_name("real"))
                _os.symlink({str(victim)!r}, path)
            return refs
        _M.write_tensors = _write
    '''
    result, _ = _past_the_static_check("gemm_residual", leak)
    assert (result.outcome is Outcome.CRASH and "unusable" in result.reason
            and "untouched" not in result.reason), result.reason


@needs_bwrap
def test_the_checker_reads_back_no_more_than_the_task_outputs_need():
    """A sparse file with a 2 GiB tensor ref costs the runner nothing; the checker refuses it before
    reading."""
    sparse = '''
        import sys as _sys, os as _os
        _M = _sys.modules["coda_agent.runner.serve"]  # the runner's loop (python -m coda_agent.runner)
        _orig = _M.write_tensors
        def _write(path, tensors):
            refs = _orig(path, tensors)
            if path.name.startswith("out_"):
                size = _os.path.getsize(path)
                with open(path, "r+b") as f:
                    f.truncate(size + (2 << 30))
                refs.append(_sys.modules["coda_agent.runner.protocol"].TensorRef(''' \
        '''name="0/extra", dtype="uint8", shape=[2 << 30], offset=size, nbytes=2 << 30))
            return refs
        _M.write_tensors = _write
    '''
    result, _ = _past_the_static_check("gemm_residual", sparse)
    assert result.outcome is Outcome.CRASH and "more than the" in result.reason, result.reason


@needs_bwrap
@pytest.mark.parametrize(("kind", "forged", "problem"), [
    ("Ran", '{"ok": true, "times_us": ["fast"]}', "times_us.0: Input should be a valid number"),
    ("Dropped", '{"ok": true, "modified": {}, "verdict": "passed"}',
     "verdict: Extra inputs are not permitted"),
    ("Fetched", '{"ok": true, "tensors": [], "calls": []}', "file: Field required"),
    ("Done", '{"error": "no ok"}', "'ok' must be true or false, not None"),
])
def test_a_malformed_reply_is_a_crash_that_says_what_was_wrong(kind, forged, problem):
    """What the runner sends in place of a reply is refused as a whole, never half-read or taken for the
    candidate's own error."""
    forge = f'''
        import sys as _sys
        _P = _sys.modules["coda_agent.runner.protocol"]
        _send = _P.Channel.send
        def _forged(self, message):
            if type(message).__name__ != {kind!r}:
                return _send(self, message)
            self._writer.write({forged!r}.encode() + b"\\n")
            self._writer.flush()
        _P.Channel.send = _forged
    '''
    result, _ = _past_the_static_check("gemm_residual", forge)
    assert (result.outcome is Outcome.CRASH and "is malformed" in result.reason
            and problem in result.reason), result.reason


def test_a_folder_the_runner_writes_must_be_this_users_and_closed_to_others(tmp_path):
    mine = tmp_path / "cache" / "by-source" / "abc"
    mine.mkdir(parents=True)
    (tmp_path / "cache").chmod(0o777)  # left open by an older version: closed, not refused
    sandbox.check_private(mine)
    assert (tmp_path / "cache").stat().st_mode & 0o022 == 0
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        (theirs / "by-source").mkdir()
        with pytest.raises(sandbox.UnsafeFolder, match="another user"):
            sandbox.check_private(theirs / "by-source")


def test_a_message_nested_too_deep_is_a_protocol_error_not_a_checker_crash():
    import io

    from coda_agent.runner.protocol import Channel, ProtocolError

    channel = Channel(io.BytesIO(b"[" * 200_000 + b"\n"), io.BytesIO())
    with pytest.raises(ProtocolError, match="nested too deep"):
        channel.recv()


def test_a_reply_is_refused_unless_it_is_exactly_the_kind_its_request_expects():
    from coda_agent.runner.protocol import Done, Failed, Fetched, ProtocolError, Ran, parse_reply

    assert (parse_reply({"ok": True, "times_us": [1, 2.5], "peak_bytes": 7}, Ran)
            == Ran(times_us=[1.0, 2.5], peak_bytes=7))
    assert parse_reply({"ok": False, "error": "boom", "call": 3}, Ran) == Failed(error="boom", call=3)
    # a diagnostic: dropped, not fatal
    assert parse_reply({"ok": True, "peak_bytes": "lots"}, Done).peak_bytes is None
    assert parse_reply({"ok": True, "times_us": [1.0], "host_us": ["x"]}, Ran).host_us == []
    refused = [
        ({"ok": "yes"}, Done, "'ok' must be true or false, not 'yes'"),
        ({"ok": True, "times_us": [1.0], "modified": {}}, Ran, "modified: Extra inputs are not permitted"),
        ({"ok": True, "times_us": ["1"]}, Ran, "times_us.0: Input should be a valid number"),
        ({"ok": True, "times_us": [-1.0]}, Ran, "times_us.0: Input should be greater than or equal to 0"),
        ({"ok": True, "file": "out_1.bin", "tensors": [], "calls": [{"call": "0", "kind": "dict"}]}, Fetched,
         "calls.0.call"),
        ({"ok": True, "file": "out_1.bin", "calls": []}, Fetched, "tensors: Field required"),
        ({"ok": False, "call": 1}, Ran, "not a Failed reply: error: Field required"),
        ({"ok": True, "x" * 100_000: 1}, Done, "Extra inputs are not permitted"),
    ]
    for message, expected, problem in refused:
        with pytest.raises(ProtocolError) as caught:
            parse_reply(message, expected)
        assert (problem in str(caught.value)
                and len(str(caught.value)) < 1000), (message, str(caught.value)[:200])


def test_an_unknown_or_malformed_request_gets_a_harness_error_reply(tmp_path):
    """The runner answers each with a ``harness`` failure (the checker's fault, not the candidate's) and
    serves on."""
    import io
    import json

    from coda_agent.runner.protocol import Channel
    from coda_agent.runner.serve import Runner, serve

    requests = [{"op": "teleport"}, {"backend": "torch"}, {"op": "run", "calls": [1]},
                {"op": "drop", "sets": [], "all": True},
                {"op": "discover", "inputs": {"x": {"shape": [2], "dtype": "complex32"}}},
                {"op": "drop", "sets": ["s"]}, {"op": "exit"}]
    out = io.BytesIO()
    serve(Channel(io.BytesIO(b"".join(json.dumps(r).encode() + b"\n" for r in requests)), out),
          Runner(tmp_path))
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["ok"] for r in replies] == [False] * 5 + [True]  # and the loop ended on exit
    assert all(r["harness"] for r in replies[:5])
    errors = [r["error"] for r in replies[:5]]
    assert errors[0] == "unknown request 'teleport'" and errors[1] == "unknown request None"
    assert errors[2] == "malformed 'run' request: run.calls.0: Input should be a valid string"
    assert errors[3] == "malformed 'drop' request: drop.all: Extra inputs are not permitted"
    assert "unknown dtype 'complex32'" in errors[4]
    assert replies[5] == {"ok": True, "modified": {}}


#: Tensors of every kind a transfer must carry: a bool, an odd-sized FP32, bf16, an empty one, a strided view.
MIXED_TENSORS = {
    "flags": torch.tensor([True, False, True]),
    "x": torch.randn(3, 5, dtype=torch.float32),
    "h": torch.randn(7, dtype=torch.bfloat16),
    "empty": torch.empty(0, 4, dtype=torch.float16),
    "strided": torch.arange(12, dtype=torch.int64).reshape(3, 4).t(),
}


def test_tensor_files_carry_every_dtype_and_shape_whatever_their_offsets(tmp_path):
    """Tensors back to back in one file: an odd-sized one leaves the next misaligned, which the reader must
    copy out, not view; each tensor read on the CPU owns its memory."""
    from coda_agent.runner.protocol import read_tensors, write_tensors

    sent = MIXED_TENSORS
    refs = write_tensors(tmp_path / "t.bin", sent)
    assert [r.offset % 4 for r in refs][:2] == [0, 3]  # "x" starts misaligned
    got = read_tensors(tmp_path / "t.bin", refs)
    assert list(got) == list(sent)
    for name, t in sent.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape and torch.equal(got[name], t), name
    got["x"].zero_()
    assert (torch.equal(got["h"], sent["h"])
            and torch.equal(read_tensors(tmp_path / "t.bin", refs)["x"], sent["x"]))


@pytest.mark.gpu
def test_tensor_files_between_gpus_go_through_page_locked_buffers(tmp_path):
    """CUDA tensors (strided, misaligned in the file, empty) arrive on the GPU as they were sent, through the
    host allocator's page-locked blocks, which a second transfer of the same size reuses."""
    from coda_agent.runner.protocol import _host_buffer, read_tensors, write_tensors

    sent = {
        "flags": torch.tensor([True, False, True], device="cuda"),
        "x": torch.randn(300, 500, device="cuda"),
        "h": torch.randn(64, 96, device="cuda", dtype=torch.bfloat16).t(),
        "empty": torch.empty(0, 4, device="cuda", dtype=torch.float16),
    }
    for _ in range(2):
        refs = write_tensors(tmp_path / "t.bin", sent)
        got = read_tensors(tmp_path / "t.bin", refs, "cuda")
        for name, t in sent.items():
            assert got[name].is_cuda and got[name].dtype == t.dtype and torch.equal(got[name], t), name
    assert _host_buffer(1 << 20, pinned=True).is_pinned()


def test_a_folder_a_runner_left_is_handed_back_to_the_next_runner_only(tmp_path):
    """A runner as nobody leaves its source's QuACK cache owned by nobody: the next runner as nobody gets it
    back; a folder of any other user, or a nobody-owned folder above it, is still refused."""
    if os.geteuid() != 0:
        pytest.skip("needs root to own folders as other users")
    cache = tmp_path / "by-source" / "abc"
    cache.mkdir(parents=True)
    os.chown(cache, sandbox.NOBODY, sandbox.NOBODY)
    cache.chmod(0o777)  # the runner opened it: closed again, not refused
    with pytest.raises(sandbox.UnsafeFolder, match="another user"):
        sandbox.check_private(cache)  # the runner is not nobody
    sandbox.check_private(cache, runner_uid=sandbox.NOBODY)
    assert cache.stat().st_mode & 0o022 == 0
    os.chown(cache, 1234, 1234)
    with pytest.raises(sandbox.UnsafeFolder, match="uid 1234"):
        sandbox.check_private(cache, runner_uid=sandbox.NOBODY)
    os.chown(cache, 0, 0)
    os.chown(cache.parent, sandbox.NOBODY, sandbox.NOBODY)  # only the folder itself may be the runner's
    with pytest.raises(sandbox.UnsafeFolder, match="another user"):
        sandbox.check_private(cache, runner_uid=sandbox.NOBODY)


def _as(as_nobody: bool) -> Sandbox:
    box = sandbox.detect()
    if not box.isolated or as_nobody != box.as_nobody:
        pytest.skip(
            f"runners cannot run {'as nobody' if as_nobody else 'in bubblewrap'} here: {box.describe()}")
    return Sandbox("bwrap", bwrap=box.bwrap, as_nobody=as_nobody)


@pytest.mark.parametrize("as_nobody", [True, False], ids=["as-nobody", "as-this-user"])
def test_runners_over_one_source_follow_one_another_in_either_mode(as_nobody, monkeypatch, scratch):
    """The CPU stages, then a re-verify of the same source: each runner reuses the QuACK cache the one before
    left (on the H200 the second runner as nobody was refused its own cache: every profile stage ended
    infra_error)."""
    from coda_agent import verifier
    from coda_agent.tasks import find_task

    monkeypatch.setattr("coda_agent.verifier.client.detect", lambda: _as(as_nobody))
    monkeypatch.setenv("QUACK_CACHE_DIR", str(scratch / "quack"))
    task = find_task("gemm_residual")
    source = task.human_file.read_text()
    for _ in range(2):
        verdict = verifier.verify(task, source, Plan(shape_names=["tiny"], seeds=[0]))
        assert verdict.outcome is Outcome.PASSED, verdict.reason
    cache = next((scratch / "quack" / "by-source").iterdir())
    assert cache.stat().st_uid == (sandbox.NOBODY if as_nobody else os.geteuid())


def test_hand_over_gives_the_folder_never_what_it_holds(tmp_path):
    """A runner may swap anything below its folder for a link: root changes the folder itself only, which the
    checker made and whose parent no runner can write (the take-back walk followed a swapped link: issue
    46)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give folders away")
    outside = tmp_path / "outside"
    outside.write_text("x")
    folder = tmp_path / "cache"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "kernel.o").write_bytes(b"\0")
    (folder / "link").symlink_to(outside)
    sandbox.hand_over(folder, sandbox.NOBODY)
    assert folder.lstat().st_uid == sandbox.NOBODY
    assert {p.lstat().st_uid
            for p in (folder / "sub", folder / "sub" / "kernel.o", folder / "link", outside)} == {0}


def test_no_runner_starts_as_root_even_from_a_sandbox_made_by_hand(scratch):
    if os.geteuid() != 0:
        pytest.skip("only root could run a runner as root")
    box = Sandbox("bwrap", bwrap=sandbox.detect().bwrap or "bwrap", as_nobody=False)
    with pytest.raises(SandboxUnavailable, match="never runs as root"):
        box.popen([sys.executable, "-c", "pass"], Spec(scratch=scratch))


def test_the_checkers_working_folder_is_not_a_runners_python_path(monkeypatch, tmp_path):
    """``python -m coda_agent`` puts its working folder first on sys.path; one closed to other users made the
    probe as nobody fail, and every runner of that checker run as root."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert str(tmp_path) not in sandbox.python_path()
    assert (str(tmp_path)
            not in sandbox.runner_env(sandbox.Spec(scratch=tmp_path)).get("PYTHONPATH", "").split(os.pathsep))
    # a checkout run in place: its folder stays
    monkeypatch.setattr(sandbox, "PACKAGE", tmp_path / "coda_agent")
    assert str(tmp_path) in sandbox.python_path()


def test_ci_runs_the_runners_as_nobody():
    """CI is root, as the GPU image's user is: its runners must drop to nobody there (.ci/run opens Python's
    folders), or the path the GPU box takes goes untested again."""
    if not os.environ.get("CI") or os.geteuid() != 0:
        pytest.skip("only CI (as root) must drop to nobody")
    box = sandbox.detect()
    assert box.isolated and box.as_nobody and box.runner_user == "nobody", box.describe()


def test_a_folder_nobody_cannot_reach_is_refused_with_its_cause(tmp_path):
    """pytest's own temporary folder is closed to other users: a runner as nobody given a folder below it
    would die in bubblewrap with no word of why; the checker names the folder and what to do instead."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(sandbox.UnsafeFolder, match=f"cannot reach .*{closed.name}.*chmod o\\+x"):
        sandbox.check_reachable(closed / "cache")


def test_an_editable_checkout_under_tmp_stays_visible_inside(monkeypatch):
    """An editable install imports the package from its checkout, which is on no sys.path entry: a checkout
    under /tmp must survive the runner's private /tmp (it ran every candidate unsandboxed, blaming
    namespaces)."""
    with contextlib.ExitStack() as stack:
        checkout = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="coda_clone_"))) / "coda_agent"
        checkout.mkdir()
        monkeypatch.setattr(sandbox, "PACKAGE", checkout)
        assert str(checkout) in sandbox._needed_under_tmp()


def test_a_failed_probe_names_its_cause():
    def probe(rc: int, out: str = "", err: str = "") -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess([], rc, out.encode(), err.encode())

    unreadable = sandbox._probe_failure(probe(3, "/root/.pyenv/versions/3.11.7\n"), "nobody")
    assert "nobody cannot read /root/.pyenv/versions/3.11.7" in unreadable and "chmod o+x" in unreadable
    denied = sandbox._probe_failure(probe(1, err="bwrap: execvp /x/bin/python: Permission denied"), "nobody")
    assert "cannot run Python" in denied and "namespaces" not in denied
    userns = sandbox._probe_failure(probe(1, err="bwrap: No permissions to create new namespace"),
                                    "this user")
    assert "cannot create namespaces" in userns
