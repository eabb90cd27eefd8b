"""The load-ahead kernel (``Config.load_ahead``, ``primitives/_ahead.py``) on a GPU: every human kernel's
outputs equal QuACK's kernel's bit for bit at the small shapes, since both run the same mainloop and the same
epilogue code; only who issues the epilogue's loads, and when, differs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from coda_agent.primitives import _quack, backend
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
