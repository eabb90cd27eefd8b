"""The runner's scratch folders: each is named after the process that made it (``coda_runner_<pid>_...``), so one
left behind by a process that died without cleaning up (``kill -9``, a power cut) is found and removed later."""

from __future__ import annotations

import functools
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from .sandbox import NOBODY

PREFIX = "coda_runner_"
_OWNED = re.compile(rf"{PREFIX}(\d+)_")


def scratch_prefix() -> str:
    """The prefix of a new scratch folder of this process (``tempfile.mkdtemp(prefix=...)``)."""
    return f"{PREFIX}{os.getpid()}_"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _ours() -> set[int]:
    """Who owns this user's scratch folders: this user, and as root also ``nobody``, to whom the sandbox hands them."""
    uid = os.geteuid()
    return {uid, NOBODY} if uid == 0 else {uid}


def remove_stale(folder: Path | None = None) -> list[Path]:
    """Remove the scratch folders in ``folder`` (the temp folder) that belong to this user and whose process is gone;
    the ones removed. A folder of a live process, another user's, a link, or one without a pid is left alone."""
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
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in owners or _alive(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


@functools.cache
def remove_stale_once() -> int:
    """:func:`remove_stale` once per process (the first verification, a resumed run); how many were removed."""
    return len(remove_stale())
