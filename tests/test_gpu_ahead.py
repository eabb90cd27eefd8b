"""The load-ahead kernel (``Config.load_ahead``, ``primitives/_ahead.py``) on a GPU: every human kernel's
outputs equal QuACK's kernel's bit for bit at the small shapes, since both run the same mainloop and the same
epilogue code; only who issues the epilogue's loads, and when, differs."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from coda_agent.primitives import _ahead, _quack, backend
from coda_agent.primitives._ahead import LoadAheadSm90
from coda_agent.tasks import load_tasks
from coda_agent.tasks.loader import import_file

from .conftest import TASK_DIR

pytestmark = pytest.mark.gpu
TASKS = load_tasks([TASK_DIR])


@contextmanager
def kernel(ahead: bool, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every gemm call of the block on one kernel, whatever its config says."""
    chosen = _quack.kernel_config
    with monkeypatch.context() as m:
        m.setattr(_quack, "kernel_config", lambda call: dataclasses.replace(chosen(call), load_ahead=ahead))
        with backend.using("quack"):
            yield


@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
def test_the_load_ahead_kernel_matches_quacks_bit_for_bit(task, monkeypatch):
    human = import_file(task.human_file, f"ahead_{task.name}")
    for point in task.shapes["small"]:
        inputs = task.make_inputs(dict(point.dims), seed=0, device="cuda")
        with kernel(False, monkeypatch):
            want = human.forward(**inputs, **task.constants)
        with kernel(True, monkeypatch):
            got = human.forward(**inputs, **task.constants)
        torch.cuda.synchronize()
        assert set(got) == set(want)
        for name, value in want.items():
            assert torch.equal(got[name], value), f"{task.name} @ {point.name}: {name} differs"


class VectorsAhead(LoadAheadSm90):
    """The load-ahead kernel with the epilogue's row and column vectors loaded by the epilogue-load warp."""

    vectors_ahead = True


VECTOR_TASKS = [t for t in TASKS if "VecLoad(" in t.human_file.read_text()]


@pytest.mark.parametrize("tile", [None, (128, 128, False)], ids=["own tile", "128x128 cooperative"])
@pytest.mark.parametrize("task", VECTOR_TASKS, ids=[t.name for t in VECTOR_TASKS])
def test_vectors_loaded_ahead_match_quacks_kernel_bit_for_bit(task, tile, monkeypatch):
    """``LoadAheadSm90.vectors_ahead``: the small shapes (a ragged one: zeros past a vector's end) and the
    ragged one 128 times as tall (several tiles a CTA: the stages and their phases turn over), against
    QuACK's kernel at the same tile."""
    human = import_file(task.human_file, f"vectors_{task.name}")
    chosen = _quack.kernel_config

    def at(call, ahead):
        config = dataclasses.replace(chosen(call), load_ahead=ahead)
        if tile is not None:
            config = dataclasses.replace(config, tile_m=tile[0], tile_n=tile[1], pingpong=tile[2])
        return config

    ragged = dict(task.shapes["small"][-1].dims)
    points = [dict(p.dims) for p in task.shapes["small"]] + [{**ragged, "M": ragged["M"] * 128}]
    for dims in points:
        inputs = task.make_inputs(dims, seed=0, device="cuda")
        with monkeypatch.context() as m, backend.using("quack"):
            m.setattr(_quack, "kernel_config", lambda call: at(call, False))
            want = human.forward(**inputs, **task.constants)
        with monkeypatch.context() as m, backend.using("quack"):
            m.setattr(_quack, "kernel_config", lambda call: at(call, True))
            m.setattr(_ahead, "AheadEpiMod", functools.partial(_ahead.AheadEpiMod, kernel=VectorsAhead))
            got = human.forward(**inputs, **task.constants)
        torch.cuda.synchronize()
        assert set(got) == set(want)
        for name, value in want.items():
            assert torch.equal(got[name], value), f"{task.name} @ {dims}: {name} differs"
