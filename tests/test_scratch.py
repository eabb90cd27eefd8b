"""The runner's scratch folders that a killed process left behind (``kill -9``) are removed later: only this
user's, only those whose process is gone (issue 41)."""

from __future__ import annotations

import os
import subprocess
import sys

from coda_agent.verifier.scratch import PREFIX, remove_stale, scratch_prefix


def test_a_scratch_folder_names_its_process():
    assert scratch_prefix() == f"{PREFIX}{os.getpid()}_"


def test_only_the_folders_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
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
