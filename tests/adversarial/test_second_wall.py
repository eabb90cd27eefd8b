"""The second wall: code that got past the static check still cannot touch the host (issue 46).

Each test starts the project's own sandboxed runner (``Sandbox.popen``, as the verifier does, or the whole
``RunnerClient``) on a payload the static check would refuse, as an adversarial review did, and checks what
the host sees afterwards. CI runs as root, so there the runners run as nobody; a test that needs root says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coda_agent.tasks import find_task
from coda_agent.verifier import Plan, sandbox, scratch, verify
from coda_agent.verifier.caches import _own_root, prune
from coda_agent.verifier.client import RunnerClient
from coda_agent.verifier.sandbox import Limits, Sandbox, SandboxUnavailable, Spec
from coda_agent.verifier.verdict import Outcome

from ..conftest import runner_folder

pytestmark = pytest.mark.slow
needs_bwrap = pytest.mark.skipif(not sandbox.detect().isolated,
                                 reason="bubblewrap cannot create namespaces here")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root's checker drops its runners to nobody")


def _run(box: Sandbox, payload: str, spec: Spec, timeout: float = 120) -> dict[str, object]:
    """Run ``payload`` in a runner of ``box``; what it printed last, as JSON."""
    proc = box.popen([sys.executable, "-c", textwrap.dedent(payload)], spec, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])


@contextlib.contextmanager
def _fresh_detection() -> Iterator[None]:
    """``detect()`` probes again inside the block, and after it (the block may change what it finds)."""
    sandbox.detect.cache_clear()
    try:
        yield
    finally:
        sandbox.detect.cache_clear()


@needs_root
@needs_bwrap
def test_a_runner_swapping_its_cache_for_links_gets_no_host_file_chowned(tmp_path):
    """A live runner swaps folders of its source's cache for links to root's files in a loop, while the
    checker prepares the same cache for the next runners of that source (tune builders, ``run -k N``, sweeps).
    The checker walked the cache by path as root and chowned what the links reached (21-77 of 200 canaries in
    the review)."""
    canaries = tmp_path / "canaries"
    canaries.mkdir()
    for i in range(200):
        (canaries / f"c{i}").write_text("root's")
    box = sandbox.detect()
    with runner_folder("coda_wall_") as base:
        cache = base / "cache" / "by-source" / "abc"
        payload = f"""
            import json, os, time
            os.chdir({str(cache)!r})
            for i in range(64):  # a cache of many folders: the checker's walk takes a while
                os.makedirs(f"k{{i}}/sub", exist_ok=True)
            swaps, end = 0, time.time() + 6
            while time.time() < end:  # every folder a real folder, then every one """ \
            f"""a link to root's files, by turns
                for i in range(64):
                    try:
                        os.rename(f"k{{i}}", f"m{{i}}")
                        os.symlink({str(canaries)!r}, f"k{{i}}")
                        swaps += 1
                    except OSError:
                        pass
                time.sleep(0.001)
                for i in range(64):
                    try:
                        os.unlink(f"k{{i}}")
                        os.rename(f"m{{i}}", f"k{{i}}")
                    except OSError:
                        pass
                time.sleep(0.001)
            print(json.dumps({{"swaps": swaps}}))
        """
        runner = box.popen([sys.executable, "-c", textwrap.dedent(payload)],
                           Spec(scratch=base / "s0", writable=(cache,)), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        prepared = 0
        deadline = time.monotonic() + 5
        # the next runners of this source: the checker prepares their folders
        while time.monotonic() < deadline:
            if prepared % 50 == 0:  # a whole runner start now and then, the rest the preparation alone
                other = box.popen([sys.executable, "-c", "pass"],
                                  Spec(scratch=base / f"s{prepared}", writable=(cache,)))
                other.wait(timeout=60)
            else:
                sandbox.check_private(cache, runner_uid=sandbox.NOBODY)
                sandbox.hand_over(cache, sandbox.NOBODY)
            prepared += 1
        out, err = runner.communicate(timeout=60)
    assert json.loads(out.decode().splitlines()[-1])["swaps"] > 1000, err.decode()[-1000:]
    assert prepared > 100
    assert {p.stat().st_uid for p in canaries.iterdir()} | {canaries.stat().st_uid} == {0}


@needs_root
@needs_bwrap
def test_where_nobody_cannot_read_python_no_runner_starts_and_every_command_says_why(tmp_path, monkeypatch):
    """A Python only root can read (a venv under /root, 0700): runners ran as root in silence, owned what they
    wrote, and planted a setuid-root program a local user then ran. Now nothing starts, with one line."""
    closed = tmp_path / "closed"  # pytest's temporary folder is closed to other users
    (closed / "coda_agent").mkdir(parents=True)
    monkeypatch.setattr(sandbox, "PACKAGE", closed / "coda_agent")
    with _fresh_detection():
        box = sandbox.detect()
        assert box.refused and not box.isolated
        assert "nobody cannot read" in box.refused and "chmod o+x" in box.refused and "root" in box.refused
        with runner_folder("coda_wall_") as base, pytest.raises(SandboxUnavailable,
                                                                match="no runner can start"):
            box.popen([sys.executable, "-c", "pass"], Spec(scratch=base / "s"))
        task = find_task("gemm_residual")
        verdict = verify(task, task.human_file.read_text(), Plan(shape_names=["tiny"], seeds=[0]))
        assert verdict.outcome is Outcome.INFRA_ERROR and verdict.reason == box.refused
        with pytest.raises(SandboxUnavailable, match="no runner can start"):
            sandbox.require_isolation("an agent run")


@needs_root
def test_the_fallback_without_bubblewrap_runs_candidates_as_nobody(monkeypatch):
    """Without bubblewrap a runner read a planted key from its parent's environ, wrote to / and left a daemon,
    as root. As nobody it can do none of the first two."""
    monkeypatch.setenv("CODA_AGENT_BWRAP", "")
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with _fresh_detection():
        box = sandbox.detect()
    assert box.kind == "process" and box.as_nobody and not box.refused, box.describe()
    payload = """
        import json, os
        def tries(fn):
            try:
                fn()
                return True
            except OSError:
                return False
        print(json.dumps({"uid": os.geteuid(), "parent_environ": """ \
        """tries(lambda: open(f"/proc/{os.getppid()}/environ").read()),
                          "write_root": tries(lambda: open("/coda-wall-probe", "w").close())}))
    """
    with runner_folder("coda_wall_") as base:
        seen = _run(box, payload, Spec(scratch=base / "s"))
    assert seen == {"uid": sandbox.NOBODY, "parent_environ": False, "write_root": False}
    assert not Path("/coda-wall-probe").exists()


@needs_bwrap
def test_the_runners_tmp_and_shared_memory_are_sized_and_its_folders_nosuid():
    """tmpfs pages are host memory no rlimit counts: a runner filled an unsized /tmp with 2.1 GB. And a
    program a runner leaves in its folders never runs set-uid from there."""
    payload = """
        import errno, json, os
        def fill(path):
            try:
                with open(path, "wb") as f:
                    for _ in range(64):
                        f.write(b"\\0" * (1 << 20))
                        f.flush()
                return "wrote 64 MiB"
            except OSError as exc:
                return errno.errorcode.get(exc.errno, str(exc.errno))
        mounts = {line.split()[4]: line.split()[5] for line in open("/proc/self/mountinfo")}
        print(json.dumps({"tmp": fill("/tmp/fill"), "shm": fill("/dev/shm/fill"),
                          "nosuid": "nosuid" in mounts[os.getcwd()].split(",")}))
    """
    with runner_folder("coda_wall_") as base:
        seen = _run(sandbox.detect(), payload, Spec(scratch=base / "s", limits=Limits(tmpfs_bytes=8 << 20)))
    assert seen == {"tmp": "ENOSPC", "shm": "ENOSPC", "nosuid": True}
    assert Limits().tmpfs_bytes <= sandbox.host_memory() // 8
    assert Limits().memory_bytes is not None and Limits().memory_bytes <= sandbox.host_memory() // 2


@needs_bwrap
def test_a_deep_chain_a_runner_leaves_breaks_no_later_verification(monkeypatch):
    """A 1,100-deep chain in a runner's scratch made cleanup raise RecursionError, and every later process's
    stale-scratch sweep with it: the honest kernel's verify died with a traceback."""
    chain = """
        import os
        fd = os.open(".", os.O_RDONLY)
        for _ in range(3000):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(fd)
    """
    source = textwrap.dedent(chain) + "\ndef forward(**kw):\n    return {}\n"
    client = RunnerClient(source, backend="torch", device="cpu", constants={},
                          deadline=time.monotonic() + 120)
    folder = client.scratch
    client.close()  # removes the scratch, chain and all, without raising
    assert not folder.exists()
    # left behind by dead processes: one deep, one named past pid_max
    with runner_folder("coda_wall_") as base:
        for name in ("coda_runner_999999999_x", f"coda_runner_{2**70}_y"):
            _chain(base / name, 1500)
        removed = scratch.remove_stale(base)
        assert len(removed) == 2 and not list(base.iterdir())
    task = find_task("gemm_residual")
    verdict = verify(task, task.human_file.read_text(), Plan(shape_names=["tiny"], seeds=[0]))
    assert verdict.outcome is Outcome.PASSED, verdict.reason


def _chain(top: Path, depth: int) -> None:
    """``top``/d/d/... ``depth`` folders deep (made through folder handles: the path is too long to name)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)


def test_the_caches_are_pruned_least_recently_used_first_and_one_in_use_stays(tmp_path):
    """What runners wrote to their caches stayed forever (1.1 GB after a review)."""
    root = tmp_path / "root"
    now = time.time()
    for name, age_h, mib in (("old", 50, 3), ("mid", 20, 3), ("new", 2, 3), ("busy", 0, 3)):
        folder = root / "by-source" / name
        folder.mkdir(parents=True)
        (folder / "kernel.o").write_bytes(os.urandom(mib << 20))
        os.utime(folder, (now - age_h * 3600, now - age_h * 3600))
    removed = prune(root, budget=7 << 20, now=now)
    assert [p.name for p in removed] == ["old", "mid"]
    assert sorted(p.name for p in (root / "by-source").iterdir()) == ["busy", "new"]
    assert prune(root, budget=1 << 20, now=now) == [root / "by-source" / "new"]  # "busy" is in use: it stays


@needs_root
def test_a_cache_root_another_user_made_first_costs_a_fresh_one_not_a_failed_verification(tmp_path):
    """A local user who makes $TMPDIR/coda_quack_cache first turned every verification of root into
    infra_error."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    squatted = temp / f"coda_quack_cache-{os.geteuid()}"
    squatted.mkdir()
    os.chown(squatted, 1234, 1234)
    root = _own_root.__wrapped__(temp, os.geteuid())
    assert root != squatted and root.parent == temp and root.name.startswith(squatted.name + "-")
    assert root.stat().st_uid == os.geteuid() and not root.stat().st_mode & 0o022


def test_removal_never_follows_a_link_a_runner_planted(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "to_outside").symlink_to(outside)
    (tree / "to_outside").symlink_to(outside)
    assert scratch.remove_tree(tree) and not tree.exists()
    assert (outside / "keep").read_text() == "x"
    assert not scratch.remove_tree(Path(tempfile.gettempdir()) / "no-such-parent" / "x")  # logged, no raise
