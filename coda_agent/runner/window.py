"""A window of memory the checker and its runner both map: how tensors cross between them without a file.

The tensor files of :mod:`.protocol` cost a write and a read through the kernel, each at memory-copy speed: at
the 256k-vocabulary head one call's 4.2 GB of logits took 2.1-2.3 s to reach the checker, most of that task's
verify and of each tune proposal (H200, ``bench/results/h200-2026-12-05-c-notes.md``). A window is a memory
file (memfd) the checker makes, sizes and seals before the runner inherits it, so each side copies straight
into or out of the same pages, by DMA where CUDA has them registered: 4.2 GB from a GPU tensor to a GPU tensor
took 0.153 s through a window (27.5 GB/s) and 1.54 s through the file (H100,
``bench/results/h100-2026-12-05-e-transfer.log``).

The seals are what make it safe to map: nobody can shrink or grow the file, so no page of the checker's
mapping can vanish under it (a file the runner could truncate would kill the checker with SIGBUS where it
reads). The runner may still write the window at any time; the checker copies what it reads out of it, whole,
before it looks at a byte, and validates every :class:`~.protocol.TensorRef` against the window's size and its
own byte limit first, so all a runner can change is the numbers the checker then checks.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import mmap
import os
import threading
from collections.abc import Mapping
from typing import Any

import torch

from .protocol import ProtocolError, TensorRef, checked_dtype, dtype_name

#: Where each tensor starts (bytes): every dtype's element size divides it, as a GPU copy's best alignment
#: does.
ALIGN = 512
#: The environment variable that names the inherited window's descriptor in the runner.
WINDOW_FD_ENV = "CODA_RUNNER_WINDOW_FD"
#: ``cudaHostRegisterPortable``: pinned for every CUDA context of the process, whichever device is current.
HOST_REGISTER_PORTABLE = 1
#: How much more than it needs a window registers with CUDA at once (registering pins every page: done
#: rarely).
REGISTER_STEP = 1 << 30
#: madvise(2)'s MADV_POPULATE_WRITE (Linux 5.14): make a range's pages as a write would, writing nothing.
MADV_POPULATE_WRITE = 23
#: The pages :meth:`Window.make_pages` makes per madvise call (a close waits for at most one such call each).
MAKE_STEP = 256 << 20
#: The threads that make a window's pages at once: the kernel zeroes each new page, one thread at about 2.6
#: GB/s (the 256k head's 25 GB took 9.6 s, H200), so a single thread outlasts the runner's warm-up it hides
#: behind; the GPU machines have 16 cores.
MAKERS = min(8, os.cpu_count() or 1)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _cuda_call(name: str, *args: int) -> int:
    """A CUDA runtime call of torch's (``torch.cuda.cudart()``) in a thread of its own: an error it returns is
    that thread's last error, so no later check of torch's in the caller's thread finds it pending."""
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(int(getattr(torch.cuda.cudart(), name)(*args))))
    worker.start()
    worker.join()
    return result[0] if result else -1


@functools.cache
def _madvise() -> Any:
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def _populate(address: int, nbytes: int) -> bool:
    """Make the pages of ``nbytes`` at ``address`` as a write would, writing nothing (``MADV_POPULATE_WRITE``
    through ctypes, which lets go of the GIL); False where the kernel refuses."""
    return bool(_madvise()(address, nbytes, MADV_POPULATE_WRITE) == 0)


def default_window_bytes(device: str) -> int:
    """A GPU runner's window: 32 GiB, or a quarter of the host's memory where that is less (pages are made
    only as they are written: the 256k head's correctness check moves about 25 GB at once). A CPU runner has
    none: its tensors are small, and the window would count against its address-space limit."""
    if device != "cuda":
        return 0
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
    return min(32 << 30, host // 4)


def open_window(size: int) -> Window | None:
    """A new window of ``size`` bytes, or None for no window (``size`` 0, or no memfd on this system)."""
    if size <= 0:
        return None
    try:
        return Window.create(size)
    except (AttributeError, OSError):  # no os.memfd_create (not Linux), or no memory for the mapping
        return None


class Window:
    """One mapping of a sealed memory file; tensors are laid out from its start, one after another."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self._map = mmap.mmap(fd, size)
        self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        self._registered = 0  # the first bytes CUDA has registered (0: none)
        self._unregistrable = False  # CUDA refused once: copies are staged by the driver from then on
        self._claimed = self._make_to = 0  # the first bytes a maker has taken on, and how far to make them
        self._makers: list[threading.Thread] = []
        self._making = threading.Lock()
        self._stop_making = threading.Event()

    @classmethod
    def create(cls, size: int) -> Window:
        """The checker's: a new memory file of ``size`` bytes (pages are made as they are first written),
        sealed against any change of size."""
        fd = os.memfd_create("coda_window", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int) -> Window:
        """The runner's: the window the checker handed down as descriptor ``fd``."""
        return cls(fd, os.fstat(fd).st_size)

    def write(self, tensors: Mapping[str, torch.Tensor]) -> list[TensorRef] | None:
        """Copy ``tensors`` in, each at an aligned offset; their refs, or None when they do not fit (the
        caller then sends a tensor file)."""
        refs, offset = [], 0
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            refs.append(TensorRef(name=name, dtype=dtype_name(t.dtype), shape=list(t.shape), offset=offset,
                                  nbytes=nbytes))
            offset = _aligned(offset + nbytes)
        if offset > self.size:
            return None
        if any(t.is_cuda for t in tensors.values()):
            self._register(offset)
        for ref, t in zip(refs, tensors.values(), strict=True):
            if ref.nbytes:
                self.bytes[ref.offset : ref.offset + ref.nbytes].view(t.dtype).view(t.shape).copy_(t.detach())
        return refs

    def read(self, refs: list[TensorRef], device: str, max_bytes: int) -> dict[str, torch.Tensor]:
        """Copies of the tensors ``refs`` describe, on ``device``, each ref validated (known dtype, sane
        shape, inside the window, at an offset its element size divides) and their sum within ``max_bytes``
        before any byte is copied."""
        if sum(ref.nbytes for ref in refs) > max_bytes:
            raise ProtocolError(f"the tensors in the window add up to more than the {max_bytes} bytes "
                                "expected")
        checked = [(ref, checked_dtype(ref, self.size, "the window", aligned=True)) for ref in refs]
        on_cpu = torch.device(device).type == "cpu"
        if not on_cpu and refs:
            self._register(max(ref.offset + ref.nbytes for ref in refs))
        out: dict[str, torch.Tensor] = {}
        for ref, dt in checked:
            raw = self.bytes[ref.offset : ref.offset + ref.nbytes].view(dt).reshape(ref.shape)
            # a copy of its own, whatever the device: the other side may write the window again at any time
            out[ref.name] = raw.clone() if on_cpu else raw.to(device)
        return out

    def make_pages(self, nbytes: int) -> None:
        """Have up to :data:`MAKERS` threads make the pages of the window's first ``nbytes`` now, while the
        caller goes on.

        A memory file's pages are made (allocated and zeroed) when first written: at the 256k head the first
        fetch of a correctness check wrote about 25 GB into fresh pages, 9.6 s of its 38.9 s verify (H200,
        ``bench/results/h200-2026-12-06-a-notes.md``), where a made page costs the other side's mapping only a
        cheap fault. Made by :func:`_populate`, a step at a time per thread: the content is left as it is, so
        the window may be written at the same time. A kernel without the advice (before 5.14) makes no page
        ahead, and the pages are made as first written, as before. Tensors that would not fit the window cross
        by file: for those, nothing is made."""
        if nbytes > self.size:
            return
        page = mmap.PAGESIZE
        with self._making:
            self._make_to = max(self._make_to, -(-nbytes // page) * page)
            wanted = min(MAKERS, -(-(self._make_to - self._claimed) // MAKE_STEP)) - len(self._makers)
            for _ in range(max(wanted, 0)):
                maker = threading.Thread(target=self._make, name="window pages", daemon=True)
                self._makers.append(maker)
                maker.start()

    def _make(self) -> None:
        """One maker: the next :data:`MAKE_STEP` not yet taken on, until the range is made, the window
        closes, or the kernel refuses (then nothing more is made ahead)."""
        me = threading.current_thread()
        try:
            while not self._stop_making.is_set():
                with self._making:
                    start = self._claimed
                    step = min(MAKE_STEP, self._make_to - start)
                    if step <= 0:
                        return
                    self._claimed += step
                if not _populate(self.bytes.data_ptr() + start, step):
                    with self._making:  # no such advice on this kernel, or no memory: pages come when written
                        self._make_to = self._claimed
                    return
        finally:
            with self._making:
                self._makers.remove(me)

    def _register(self, nbytes: int) -> None:
        """Have CUDA pin the window's first ``nbytes`` (and some more), so copies to and from the GPU run by
        DMA; where it cannot, copies still work, staged by the driver."""
        if nbytes <= self._registered or self._unregistrable or not torch.cuda.is_available():
            return
        if self._registered:
            _cuda_call("cudaHostUnregister", self.bytes.data_ptr())
            self._registered = 0
        want = min(self.size, _aligned(nbytes) + REGISTER_STEP)
        if _cuda_call("cudaHostRegister", self.bytes.data_ptr(), want, HOST_REGISTER_PORTABLE) == 0:
            self._registered = want
        else:
            self._unregistrable = True

    def close(self) -> None:
        self._stop_making.set()
        with self._making:
            makers = list(self._makers)
        for maker in makers:
            maker.join()
        if self._registered:
            _cuda_call("cudaHostUnregister", self.bytes.data_ptr())
            self._registered = 0
        del self.bytes
        with contextlib.suppress(BufferError):  # a tensor still viewing it: the mapping goes with the process
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
