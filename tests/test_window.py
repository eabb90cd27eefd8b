"""The shared memory window between the checker and its runner (``coda_agent.runner.window``): what crosses
it, that nobody can change its size, what the checker refuses to read from it, and a verification that uses
it."""

from __future__ import annotations

import fcntl
import os
import textwrap
import threading
import time

import pytest
import torch

from coda_agent.runner import window as window_module
from coda_agent.runner.protocol import ProtocolError, TensorRef
from coda_agent.runner.window import ALIGN, Window, open_window
from coda_agent.verifier import Plan
from coda_agent.verifier.verdict import Outcome

from .test_sandbox import MIXED_TENSORS, _as, _past_the_static_check, needs_bwrap

SENT = MIXED_TENSORS


@pytest.fixture
def window():
    w = Window.create(1 << 20)
    yield w
    w.close()


def test_a_window_carries_every_dtype_and_shape_to_a_second_mapping_as_copies(window):
    """What one side writes, the other side's mapping of the same file reads: each tensor at an aligned
    offset, read out as a copy of its own (the writer may write the window again at once)."""
    refs = window.write(SENT)
    assert refs is not None and all(r.offset % ALIGN == 0 for r in refs)
    other = Window.attach(os.dup(window.fd))  # the runner's side
    try:
        got = other.read(refs, "cpu", max_bytes=1 << 20)
        assert list(got) == list(SENT)
        for name, t in SENT.items():
            assert (got[name].dtype == t.dtype and got[name].shape == t.shape
                    and torch.equal(got[name], t)), name
        window.bytes.zero_()  # written again after the read: the copies keep what was read
        assert torch.equal(got["x"], SENT["x"])
    finally:
        other.close()


def test_nobody_can_change_a_windows_size_or_its_seals(window):
    """The seals are set before the runner inherits the file: a runner that could shrink it would kill the
    checker with SIGBUS where its mapping lost the pages."""
    with pytest.raises(PermissionError):
        os.ftruncate(window.fd, 4096)
    with pytest.raises(PermissionError):
        os.ftruncate(window.fd, 2 << 20)
    with pytest.raises(PermissionError):
        fcntl.fcntl(window.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
    assert os.fstat(window.fd).st_size == 1 << 20


@pytest.mark.parametrize("ref, problem", [
    (TensorRef(name="t", dtype="complex64", shape=[4], offset=0, nbytes=32), "unknown dtype"),
    (TensorRef(name="t", dtype="float32", shape=[4, -1], offset=0, nbytes=16), "invalid shape"),
    (TensorRef(name="t", dtype="float32", shape=[4], offset=(1 << 20) - 8, nbytes=16), "does not fit"),
    (TensorRef(name="t", dtype="float32", shape=[4], offset=2, nbytes=16), "does not fit"),
    (TensorRef(name="t", dtype="float32", shape=[4], offset=0, nbytes=12), "does not fit"),
    (TensorRef(name="t", dtype="uint8", shape=[4096], offset=0, nbytes=4096), "more than the 1024 bytes"),
])
def test_the_checker_reads_nothing_a_ref_places_outside_the_window_or_past_its_limit(window, ref, problem):
    with pytest.raises(ProtocolError, match=problem):
        window.read([ref], "cpu", max_bytes=1024)


def test_tensors_that_do_not_fit_the_window_go_back_to_a_file(window):
    assert window.write({"big": torch.empty(1 << 19, dtype=torch.float32)}) is None
    assert window.write({"fits": torch.empty((1 << 18) - ALIGN // 4, dtype=torch.float32)}) is not None


def test_no_window_where_the_system_has_no_memory_files(monkeypatch):
    assert open_window(0) is None
    monkeypatch.delattr(os, "memfd_create")
    assert open_window(1 << 20) is None
    assert window_module.default_window_bytes("cpu") == 0


def _made_bytes(w: Window) -> int:
    """The bytes of the window's memory file that have pages."""
    return os.fstat(w.fd).st_blocks * 512


@pytest.mark.skipif(tuple(map(int, os.uname().release.split(".")[:2])) < (5, 14),
                    reason="MADV_POPULATE_WRITE came with Linux 5.14")
def test_a_windows_pages_are_made_ahead_and_what_it_holds_is_kept():
    """The checker has the pages of the outputs to come made while the runner warms up (the 256k head's
    first fetch wrote 25 GB into fresh pages): a thread makes them, and what the window held, or is written
    meanwhile, stays as written."""
    w = Window.create(16 << 20)
    try:
        refs = w.write(SENT)
        assert refs is not None and _made_bytes(w) < 8 << 20
        w.make_pages(12 << 20)
        more = w.write(SENT)  # written while the pages are being made
        deadline = time.monotonic() + 20
        while _made_bytes(w) < 12 << 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _made_bytes(w) >= 12 << 20
        w.make_pages(17 << 20)  # more than the window holds: those tensors go by file, nothing is made
        time.sleep(0.1)
        assert _made_bytes(w) < 16 << 20
        got = w.read(more, "cpu", max_bytes=1 << 20)
        assert all(torch.equal(got[name], t) for name, t in SENT.items())
    finally:
        w.close()


@pytest.mark.skipif(tuple(map(int, os.uname().release.split(".")[:2])) < (5, 14),
                    reason="MADV_POPULATE_WRITE came with Linux 5.14")
def test_several_threads_make_a_windows_pages_each_step_once(monkeypatch):
    """One thread zeroes new pages at about 2.6 GB/s (the 256k head's 25 GB: 9.6 s, longer than the runner's
    warm-up it hides behind), so up to MAKERS threads share the steps; a request for more while they work
    extends their range without a second maker per step."""
    monkeypatch.setattr(window_module, "MAKE_STEP", 1 << 20)
    monkeypatch.setattr(window_module, "MAKERS", 3)
    populate, steps, lock = window_module._populate, [], threading.Lock()

    def recorded(address: int, nbytes: int) -> bool:
        with lock:
            steps.append((address, nbytes, threading.get_ident()))
        time.sleep(0.01)  # long enough for the makers to overlap
        return populate(address, nbytes)

    monkeypatch.setattr(window_module, "_populate", recorded)
    w = Window.create(32 << 20)
    try:
        w.make_pages(12 << 20)
        w.make_pages(20 << 20)
        deadline = time.monotonic() + 20
        while _made_bytes(w) < 20 << 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _made_bytes(w) >= 20 << 20
        base = w.bytes.data_ptr()
        assert sorted(a - base for a, _, _ in steps) == [i << 20 for i in range(20)]
        assert {n for _, n, _ in steps} == {1 << 20} and 1 < len({t for _, _, t in steps}) <= 3
    finally:
        w.close()


def test_a_window_closes_while_its_pages_are_being_made(monkeypatch):
    """A close stops the thread after the madvise call under way, and a kernel without the advice leaves
    the window as it was (its pages made as first written)."""
    monkeypatch.setattr(window_module, "MAKE_STEP", 1 << 20)
    w = Window.create(64 << 20)
    w.make_pages(64 << 20)
    started = time.monotonic()
    w.close()
    assert time.monotonic() - started < 10
    monkeypatch.setattr(window_module, "MADV_POPULATE_WRITE", -1)  # advice no kernel knows: madvise fails
    w = Window.create(4 << 20)
    try:
        w.make_pages(4 << 20)
        time.sleep(0.2)
        assert _made_bytes(w) == 0
        refs = w.write(SENT)
        assert refs is not None and torch.equal(w.read(refs, "cpu", max_bytes=1 << 20)["x"], SENT["x"])
    finally:
        w.close()


@pytest.mark.parametrize("as_nobody", [True, False], ids=["as-nobody", "as-this-user"])
def test_a_verification_moves_its_tensors_through_the_window_in_either_mode(as_nobody, monkeypatch, scratch):
    """The descriptor reaches the runner through the rlimit shim and bubblewrap, as nobody too, and every
    input set and kept output crosses the window: the checker writes and reads it, no tensor file."""
    from coda_agent import verifier
    from coda_agent.tasks import find_task

    monkeypatch.setattr("coda_agent.verifier.client.detect", lambda: _as(as_nobody))
    monkeypatch.setattr("coda_agent.verifier.client.default_window_bytes", lambda device: 64 << 20)
    monkeypatch.setenv("QUACK_CACHE_DIR", str(scratch / "quack"))
    crossed = {"write": 0, "read": 0}
    write, read = Window.write, Window.read

    def counted_write(self, tensors):
        crossed["write"] += 1
        return write(self, tensors)

    def counted_read(self, refs, device, max_bytes):
        crossed["read"] += 1
        return read(self, refs, device, max_bytes)

    monkeypatch.setattr(Window, "write", counted_write)
    monkeypatch.setattr(Window, "read", counted_read)
    asked: list[int] = []
    make_pages = Window.make_pages
    monkeypatch.setattr(Window, "make_pages", lambda self, n: (asked.append(n), make_pages(self, n))[1])
    files = []
    monkeypatch.setattr("coda_agent.verifier.client.read_tensors", lambda *a, **k: files.append(a))
    task = find_task("gemm_residual")
    verdict = verifier.verify(task, task.human_file.read_text(), Plan(shape_names=["tiny"], seeds=[0]))
    assert verdict.outcome is Outcome.PASSED, verdict.reason
    assert crossed["write"] > 0 and crossed["read"] > 0 and not files
    # the correctness check had the pages of its kept calls' outputs made ahead, whole calls' worth
    tiny = next(point for points in task.shapes.values() for point in points if point.name == "tiny")
    per_call = task.output_bytes(tiny.dims)
    assert asked and all(n > 0 and n % per_call == 0 for n in asked)


@needs_bwrap
@pytest.mark.parametrize(("payload", "problem"), [
    # a ref past the checker's byte limit for the task's outputs, however little the window holds
    ("""
        _orig = _W.write
        def _write(self, tensors):
            refs = _orig(self, tensors)
            if refs is not None:
                refs.append(_P.TensorRef(name="0/extra", dtype="uint8", shape=[2 << 30], offset=0,
                                         nbytes=2 << 30))
            return refs
        _W.write = _write
    """, "more than the"),
    # a ref past the window's end
    ("""
        _orig = _W.write
        def _write(self, tensors):
            refs = _orig(self, tensors)
            if refs is not None:
                refs[0] = refs[0].model_copy(update={"offset": self.size - 4})
            return refs
        _W.write = _write
    """, "does not fit the window"),
], ids=["over-the-limit", "past-the-end"])
def test_what_a_runner_forges_in_the_window_is_refused_as_a_crash(payload, problem, monkeypatch):
    """Code past the static check rewrites the runner's side of the window: every forged ref is refused
    before a byte is read, and the runner cannot shrink the window under the checker's mapping."""
    monkeypatch.setattr("coda_agent.verifier.client.default_window_bytes", lambda device: 64 << 20)
    prelude = """
        import sys as _sys, os as _os
        _W = _sys.modules["coda_agent.runner.window"].Window
        _P = _sys.modules["coda_agent.runner.protocol"]
    """
    result, _ = _past_the_static_check("gemm_residual", textwrap.dedent(prelude) + textwrap.dedent(payload))
    assert result.outcome is Outcome.CRASH and problem in result.reason, result.reason
    shrink = """
        import os as _os
        _fd = int(_os.environ["CODA_RUNNER_WINDOW_FD"])
        _os.ftruncate(_fd, 4096)
    """
    result, _ = _past_the_static_check("gemm_residual", shrink)
    assert result.outcome is not Outcome.PASSED and "Operation not permitted" in result.reason, result.reason


@pytest.mark.gpu
def test_a_window_between_gpus_is_registered_with_cuda(window):
    sent = {"x": torch.randn(300, 500, device="cuda"),
            "h": torch.randn(64, 96, device="cuda", dtype=torch.bfloat16).t(),
            "flags": torch.tensor([True, False], device="cuda")}
    refs = window.write(sent)
    assert refs is not None and window._registered > 0
    got = window.read(refs, "cuda", max_bytes=1 << 20)
    for name, t in sent.items():
        assert got[name].is_cuda and torch.equal(got[name], t), name
