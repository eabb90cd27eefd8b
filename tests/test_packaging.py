"""The wheel is a complete install: the task suite and the example scripts ship inside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from .conftest import EXAMPLE_SCRIPT, REPO, TASK_DIR


def test_the_wheel_ships_the_task_suite_and_the_examples(tmp_path):
    src = tmp_path / "checkout"  # a copy, so the build leaves no build/ or egg-info in the checkout
    shutil.copytree(REPO / "coda_agent", src / "coda_agent", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Warning" not in proc.stdout + proc.stderr  # e.g. setuptools' deprecated TOML-table license
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    suite = sorted(
        p.relative_to(TASK_DIR).as_posix() for p in TASK_DIR.rglob("*") if p.suffix in (".yaml", ".py"))
    assert (len([p for p in suite if p.endswith(".yaml")]) == 13
            and len([p for p in suite if p.startswith("human/")]) == 13)
    missing = [p for p in suite if f"coda_agent/suite/{p}" not in names]
    assert not missing
    assert f"coda_agent/examples/mock/{EXAMPLE_SCRIPT.name}" in names
    assert "coda_agent/bench/runner.py" in names and "coda_agent/viewer/templates/task.html" in names
    assert "coda_agent/py.typed" in names  # type checkers read the installed package's annotations
    read = lambda suffix: zipfile.ZipFile(wheel).read(  # noqa: E731
        next(n for n in names if n.endswith(suffix))).decode()
    assert "License-Expression: Apache-2.0" in read(".dist-info/METADATA")
    # --version without torch
    assert "coda-agent = coda_agent.launch:main" in read(".dist-info/entry_points.txt")


def test_an_editable_install_builds_quietly_as_a_path_entry(tmp_path):
    """``scripts/setup.sh``'s ``pip install -e``: the PEP 660 build of the checkout warns about nothing
    (setuptools' "Editable installation" banner came from its import finder for a package it could not place)
    and puts the checkout on ``sys.path``."""
    src = tmp_path / "checkout"
    shutil.copytree(REPO / "coda_agent", src / "coda_agent", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    build = "import sys; from setuptools import build_meta; print(build_meta.build_editable(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", build, str(tmp_path / "dist")], cwd=src, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("Warning" not in proc.stderr
            and "Editable installation" not in proc.stdout + proc.stderr), proc.stderr
    wheel = tmp_path / "dist" / proc.stdout.split()[-1]
    (pth,) = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".pth")]
    assert zipfile.ZipFile(wheel).read(pth).decode().strip() == str(src.resolve())
