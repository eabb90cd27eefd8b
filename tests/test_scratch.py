"""The runner's scratch folders that a killed process left behind (``kill -9``) are removed later: only this
user's, only those whose process is gone (issue 41)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from coda_agent.verifier.sandbox import NOBODY
from coda_agent.verifier.scratch import PREFIX, remove_stale, scratch_prefix


def test_a_scratch_folder_names_its_process():
    assert scratch_prefix() == f"{PREFIX}{os.getpid()}_"


def test_only_the_folders_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    gone = tmp_path / f"{PREFIX}{dead_pid}_abc"
    (gone / "sub").mkdir(parents=True)
    (gone / "sub" / "in_0.bin").write_bytes(b"x")
    mine = tmp_path / f"{scratch_prefix()}def"  # this process's own, in use
    live = tmp_path / f"{PREFIX}{os.getppid()}_ghi"  # a live process's
    legacy = tmp_path / f"{PREFIX}jkl"  # no pid recorded: whose it is cannot be told
    for d in (mine, live, legacy):
        d.mkdir()
    link = tmp_path / f"{PREFIX}{dead_pid}_link"
    link.symlink_to(mine)
    assert remove_stale(tmp_path) == [gone]
    assert not gone.exists() and mine.is_dir() and live.is_dir() and legacy.is_dir() and link.is_symlink()


@pytest.mark.skipif(os.geteuid() != 0,
                    reason="only root hands a scratch folder to nobody, and can make one another's")
def test_as_root_a_folder_handed_to_nobody_is_ours_and_another_users_is_not(tmp_path):
    dead_pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                  capture_output=True, text=True, check=True).stdout)
    handed, other = tmp_path / f"{PREFIX}{dead_pid}_a", tmp_path / f"{PREFIX}{dead_pid}_b"
    for d, uid in ((handed, NOBODY), (other, 1234)):
        d.mkdir()
        os.chown(d, uid, uid)
    assert remove_stale(tmp_path) == [handed] and other.is_dir()
