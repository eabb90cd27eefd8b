"""How fast a kept call's outputs can move from the runner to the checker (issue 47).

At the 256k-vocabulary head one call's logits are 4.2 GB, and the tensor file between the two processes took
2.1-2.3 s a call on the H200 (bench/results/h200-2026-12-05-c-notes.md): most of that task's verify and of each
tune proposal. This probe times, in one process, the ways the bytes could go from a GPU tensor to a GPU tensor:

- the protocol as it is: ``write_tensors`` (to page-locked memory, then one ``write``) and ``read_tensors`` (one
  ``readinto``, then to the GPU), in the temp folder and in /dev/shm;
- the same file written and read in 64 MiB pieces by several threads (``pwrite`` / ``preadv``);
- the window both sides map (``coda_agent/runner/window.py``, what a GPU runner now uses): a sealed memory file
  registered with CUDA, so each side copies by DMA and no file copy runs at all (two mappings of one memfd stand
  for the two processes);
- a fresh window's pages made ahead (``Window.make_pages``) by one thread and by ``window.MAKERS``: the 256k
  head's correctness check writes 25 GB into fresh pages, 9.6 s where they were not made (H200, 2026-12-06-a).

    source .gpu2/env.sh && python3 bench/probes/transfer_probe.py --gb 4.2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from coda_agent.runner import window as window_module
from coda_agent.runner.protocol import read_tensors, write_tensors
from coda_agent.runner.window import Window

PIECE = 64 << 20


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def protocol(src: torch.Tensor, folder: Path) -> Callable[[], object]:
    def go() -> object:
        path = folder / f"out_{os.getpid()}.bin"
        refs = write_tensors(path, {"logits": src})
        got = read_tensors(path, refs, "cuda")["logits"]
        path.unlink()
        return got
    return go


def threaded(src: torch.Tensor, folder: Path, threads: int) -> Callable[[], object]:
    nbytes = src.numel() * src.element_size()
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    back = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    out = torch.empty_like(src)
    wv, rv = memoryview(host.numpy()), memoryview(back.numpy())
    pieces = range(0, nbytes, PIECE)

    def go() -> object:
        path = folder / f"out_{os.getpid()}.bin"
        host.view(src.dtype).view(src.shape).copy_(src)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda o: os.pwrite(fd, wv[o:o + PIECE], o), pieces))
                list(pool.map(lambda o: os.preadv(fd, [rv[o:o + PIECE]], o), pieces))
        finally:
            os.close(fd)
            path.unlink()
        out.copy_(back.view(src.dtype).view(src.shape))
        return out
    return go


def window(src: torch.Tensor) -> Callable[[], object]:
    """The product's path on a GPU host (coda_agent/runner/window.py): the runner writes the sealed memfd, the
    checker's mapping of it (here a second mapping in this process) reads it, both registered with CUDA."""
    nbytes = src.numel() * src.element_size()
    runner = Window.create(nbytes + (1 << 20))
    checker = Window.attach(os.dup(runner.fd))
    t0 = time.perf_counter()
    refs = runner.write({"logits": src})
    checker.read(refs, "cuda", max_bytes=nbytes)
    print(f"   (the window's first use, its pages made and registered on both sides: "
          f"{time.perf_counter() - t0:.2f} s, once a runner)")

    def go() -> object:
        refs = runner.write({"logits": src})
        return checker.read(refs, "cuda", max_bytes=nbytes)["logits"]
    return go


def pages_made(nbytes: int, makers: int) -> float:
    """Seconds for ``makers`` threads to make a fresh window's first ``nbytes`` of pages."""
    window_module.MAKERS = makers
    w = Window.create(nbytes)
    try:
        t0 = time.perf_counter()
        w.make_pages(nbytes)
        while os.fstat(w.fd).st_blocks * 512 < nbytes:
            time.sleep(0.005)
        return time.perf_counter() - t0
    finally:
        w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=4.2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    n = int(a.gb * 1e9) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    temp = Path(tempfile.mkdtemp(prefix="coda_transfer_"))
    shm = Path(tempfile.mkdtemp(prefix="coda_transfer_", dir="/dev/shm")) if Path("/dev/shm").is_dir() else None
    for folder in (temp, shm):
        if folder is not None:
            info = subprocess.run(["df", "-hT", str(folder)], capture_output=True, text=True).stdout.splitlines()
            print(f"{folder}: {info[-1] if info else '?'}")
    print(f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPUs; {n * 2 / 1e9:.2f} GB a call, {a.reps} calls each")
    variants: dict[str, Callable[[], Callable[[], object]]] = {
        "protocol, temp folder": lambda: protocol(src, temp),
        "8 threads, temp folder": lambda: threaded(src, temp, 8),
        "the window (memfd mapped by both, registered)": lambda: window(src),
    }
    if shm is not None:
        variants["protocol, /dev/shm"] = lambda: protocol(src, shm)
        variants["8 threads, /dev/shm"] = lambda: threaded(src, shm, 8)
    rows = []
    for label, make in variants.items():
        try:
            fn = make()
            got = fn()
            assert torch.equal(got, src), "the bytes changed on the way"
            times = timed(fn, a.reps)
        except Exception as exc:  # one way failing (no room in /dev/shm, say) leaves the others
            print(f"   {label}: {type(exc).__name__}: {exc}")
            continue
        best = min(times)
        rows.append({"variant": label, "seconds": times, "gb_s": n * 2 / best / 1e9})
        print(f"{best:7.3f} s best of {a.reps} ({', '.join(f'{t:.3f}' for t in times)})  {n * 2 / best / 1e9:6.2f} GB/s"
              f"  {label}")
    default = window_module.MAKERS
    for makers in sorted({1, default}):
        seconds = pages_made(n * 2, makers)
        rows.append({"variant": f"pages made by {makers} threads", "seconds": [seconds],
                     "gb_s": n * 2 / seconds / 1e9})
        print(f"{seconds:7.3f} s  {n * 2 / seconds / 1e9:6.2f} GB/s  a fresh window's pages made by {makers} threads")
    window_module.MAKERS = default
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
