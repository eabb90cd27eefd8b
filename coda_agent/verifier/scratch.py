"""The runner's scratch folders, and how the checker removes what a runner wrote.

Each scratch folder is named after the process that made it (``coda_runner_<pid>_...``), so one left behind by
a process that died without cleaning up (``kill -9``, a power cut) is found and removed later. Removal
(:func:`remove_tree`) never raises: a runner decides what its folders hold (a chain thousands of folders deep,
a folder swapped for a link mid-removal, a file it made unremovable), and no such folder may fail a later
verification.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..processes import alive
from .sandbox import NOBODY

log = logging.getLogger("coda_agent.verifier")
#: How the removal opens a folder: never through a link (a runner may swap any folder of its own for one).
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(path: Path) -> bool:
    """Remove ``path`` and all below it; whether nothing is left. Iterative (no depth limit, one folder handle
    open at a time), through folder handles opened without following links (a folder a runner swaps for a link
    while this runs is removed as a link, never followed: as root this must not reach the host), and never
    raising: what cannot be removed is logged and left."""
    try:
        top = os.open(path.parent, _DIR)  # the checker's own folder (the temp folder, the cache root)
    except OSError as exc:
        log.warning("cannot remove %s: %s", path, exc)
        return False
    try:
        return _remove_entry(top, path.name)
    except Exception as exc:  # never fatal: the next verification must not fail on this folder
        log.warning("cannot remove %s: %s", path, exc)
        return False
    finally:
        os.close(top)


def _remove_entry(top: int, name: str) -> bool:
    """Remove the entry ``name`` of the folder open as ``top`` (a file, a link, or a folder and all below
    it)."""
    fd = _open_folder(top, name)
    if fd is None:
        return _remove(os.unlink, top, name)
    ok = True
    # the folders from ``name`` down, their subfolders
    stack: list[tuple[str, list[str] | None]] = [(name, None)]
    while stack:
        current, pending = stack[-1]
        if pending is None:  # first visit: remove its files, list its folders
            pending = []
            for entry in _listing(fd):
                if _is_folder(fd, entry):
                    pending.append(entry)
                else:
                    ok &= _remove(os.unlink, fd, entry)
            stack[-1] = (current, pending)
        if pending:
            child = pending.pop()
            child_fd = _open_folder(fd, child)
            if child_fd is None:  # swapped for a file or a link since it was listed
                ok &= _remove(os.unlink, fd, child)
                continue
            os.close(fd)
            fd = child_fd
            stack.append((child, None))
            continue
        stack.pop()
        if stack:
            parent = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = parent
            ok &= _remove(os.rmdir, fd, current)
        else:
            os.close(fd)
            ok &= _remove(os.rmdir, top, current)
    return ok


def _open_folder(parent: int, name: str) -> int | None:
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except OSError:  # not a folder (or a link to one), or gone
        return None


def _listing(fd: int) -> list[str]:
    try:
        return os.listdir(fd)
    except OSError as exc:
        log.warning("cannot list a folder being removed: %s", exc)
        return []


def _is_folder(parent: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _remove(remove: Callable[..., None], parent: int, name: str) -> bool:
    """``remove`` (``os.unlink`` or ``os.rmdir``) the entry ``name`` of the folder ``parent``; one already
    gone counts as removed, one that cannot be is logged."""
    try:
        remove(name, dir_fd=parent)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning("cannot remove %s: %s", name, exc)
        return False
    return True


PREFIX = "coda_runner_"
_OWNED = re.compile(rf"{PREFIX}(\d+)_")


def scratch_prefix() -> str:
    """The prefix of a new scratch folder of this process (``tempfile.mkdtemp(prefix=...)``)."""
    return f"{PREFIX}{os.getpid()}_"


def _ours() -> set[int]:
    """Who owns this user's scratch folders: this user, and as root also ``nobody``, to whom the sandbox hands
    them."""
    uid = os.geteuid()
    return {uid, NOBODY} if uid == 0 else {uid}


def remove_stale(folder: Path | None = None) -> list[Path]:
    """Remove the scratch folders in ``folder`` (the temp folder) that belong to this user and whose process
    is gone; the ones removed. A folder of a live process, another user's, a link, or one without a pid is
    left alone; one that cannot be removed whole is logged, never fatal."""
    removed: list[Path] = []
    owners = _ours()
    base = folder if folder is not None else Path(tempfile.gettempdir())
    try:
        entries = list(base.glob(f"{PREFIX}*"))
    except OSError:
        return removed
    for path in entries:
        match = _OWNED.match(path.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            st = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners or alive(int(match.group(1))):
            continue
        if remove_tree(path):
            removed.append(path)
    return removed


@functools.cache
def remove_stale_once() -> int:
    """:func:`remove_stale` once per process (the first verification, a resumed run); how many were
    removed."""
    return len(remove_stale())
