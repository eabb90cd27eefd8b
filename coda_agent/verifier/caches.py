"""The runners' QuACK compile caches: one folder per candidate source, so a runner writes only its own code's;
all under a root of the checker user's; their total bounded, the least recently used sources' pruned first.

A runner decides what its cache holds, so the checker only measures and removes there, never following a link
(:func:`.scratch.remove_tree`), and never fails a verification over it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import stat
import tempfile
import time
from pathlib import Path

from .sandbox import UnsafeFolder, check_private, host_memory
from .scratch import remove_tree
from .static.schedule_source import without_schedule

log = logging.getLogger("coda_agent.verifier")
#: A cache folder the checker gave a runner this recently is never pruned (a runner of it may be running).
IN_USE_S = 3600.0


def quack_cache_for(source: str) -> Path:
    """A QuACK compile cache per candidate source: a runner can write only the cache of its own code. A pinned
    schedule does not count (the harness's tuned module reuses the kernels its search built from the same
    code)."""
    return cache_root() / "by-source" / hashlib.sha256(without_schedule(source).encode()).hexdigest()[:20]


def cache_root() -> Path:
    """``QUACK_CACHE_DIR``, else this user's folder in the temp folder (:func:`_own_root`)."""
    given = os.environ.get("QUACK_CACHE_DIR")
    return Path(given) if given else _own_root(Path(tempfile.gettempdir()), os.geteuid())


@functools.cache
def _own_root(temp: Path, uid: int) -> Path:
    """``<temp>/coda_quack_cache-<uid>``: this user's. Where another local user made that name first (or left
    it open), a fresh folder of this process's instead, said once in the log: the caches start empty, and no
    verification fails on a folder someone else planted."""
    root = temp / f"coda_quack_cache-{uid}"
    try:
        root.mkdir(mode=0o755, exist_ok=True)
        check_private(root)
        return root
    except (OSError, UnsafeFolder) as exc:
        fresh = Path(tempfile.mkdtemp(prefix=f"coda_quack_cache-{uid}-", dir=temp))
        fresh.chmod(0o755)  # runners as nobody pass through it to their own source's folder
        log.warning("QuACK cache: %s (%s); this process uses %s", root, exc, fresh)
        return fresh


def mark_used(folder: Path) -> None:
    """Note that a runner gets ``folder`` now (its time is what :func:`prune` orders by)."""
    with contextlib.suppress(OSError):  # not made yet: the runner's start makes it
        os.utime(folder)


def budget_bytes() -> int:
    """What the caches may hold together: 8 GiB, or a quarter of the free space on their disk, or the host's
    memory, whichever is least (a cache is also read back into memory)."""
    try:
        st = os.statvfs(cache_root())
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    return min(8 * 1024**3, max(free // 4, 1024**3), host_memory())


def prune(root: Path, budget: int, now: float | None = None) -> list[Path]:
    """Remove sources' caches under ``root``, least recently used first, until they hold at most ``budget``
    bytes; the ones removed. One a runner got in the last :data:`IN_USE_S` seconds stays. Never raises."""
    now = time.time() if now is None else now
    try:
        folders = [(e.stat(follow_symlinks=False).st_mtime,
                    Path(e.path)) for e in os.scandir(root / "by-source")
                   if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    sizes = {path: tree_bytes(path) for _, path in folders}
    total = sum(sizes.values())
    removed = []
    for used, path in sorted(folders):
        if total <= budget:
            break
        if now - used < IN_USE_S:
            continue
        if remove_tree(path):
            removed.append(path)
            total -= sizes[path]
    if total > budget:
        log.warning("QuACK caches under %s hold %d bytes, over the %d budget, all of them in use", root,
                    total, budget)
    return removed


def tree_bytes(folder: Path) -> int:
    """The bytes the files below ``folder`` take (links not followed; what vanishes meanwhile is not
    counted)."""
    total, todo = 0, [str(folder)]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        todo.append(entry.path)
                    else:
                        total += info.st_blocks * 512
        except OSError:
            continue
    return total


@functools.cache
def prune_once() -> int:
    """:func:`prune` of the cache root once per process (the first verification); how many sources' were
    removed."""
    return len(prune(cache_root(), budget_bytes()))
