"""``bench.memory_peak``: the allocator trace of a step replayed on the CPU (synthetic traces in the format of
``torch.cuda.memory._snapshot()['device_traces']``); its table in the markdown: ``test_bench_e2e``."""

from __future__ import annotations

import os

import torch

from coda_agent.bench.memory_peak import NO_FRAME, peak_live

LAYER = {"filename": "/x/site-packages/coda_agent/torch/layer.py", "line": 120, "name": "forward"}
QUACK = {"filename": "/x/site-packages/coda_agent/primitives/_quack.py", "line": 9, "name": "run"}
OP = {"filename": "/x/site-packages/coda_agent/torch/ops.py", "line": 122, "name": "_run"}
TORCH = {"filename": os.path.join(os.path.dirname(torch.__file__), "nn", "functional.py"), "line": 3,
         "name": "linear"}
USER = {"filename": "/home/u/train.py", "line": 7, "name": "step"}


def alloc(addr: int, size: int, *frames: dict) -> dict:
    return {"action": "alloc", "addr": addr, "size": size, "frames": list(frames)}


def free(addr: int, size: int) -> dict:
    return {"action": "free_requested", "addr": addr, "size": size, "frames": []}


def test_the_peak_is_the_most_the_steps_allocations_held_at_once():
    events = [alloc(1, 100, QUACK, OP, LAYER), alloc(2, 50, TORCH, USER), free(1, 100),
              alloc(3, 120, QUACK, OP, LAYER), alloc(4, 10),  # the peak: 50 + 120 + 10
              free(9, 1000),  # a block from before the recording: not counted
              free(3, 120), alloc(5, 60, TORCH)]
    p = peak_live(events)
    assert p.step_bytes == 180
    assert [(s.where, s.bytes, s.blocks) for s in p.shares] == [
        ("coda_agent/torch/layer.py:120 (forward)", 120, 1),  # the model's line: not the maker, not the op
        ("/home/u/train.py:7 (step)", 50, 1),  # outside torch
        (NO_FRAME, 10, 1)]


def test_a_line_that_allocates_often_is_summed_and_the_smallest_places_are_summed_as_one():
    events = [alloc(1, 30, LAYER), alloc(2, 30, LAYER)]
    events += [alloc(10 + i, i + 1, {"filename": f"/u/f{i}.py", "line": i, "name": "g"})
               for i in range(4)]
    p = peak_live(events, shares=2)
    assert [(s.where, s.bytes, s.blocks) for s in p.shares] == [
        ("coda_agent/torch/layer.py:120 (forward)", 60, 2), ("/u/f3.py:3 (g)", 4, 1),
        ("3 other places", 6, 3)]
    assert p.step_bytes == sum(s.bytes for s in p.shares)


def test_an_empty_trace_has_no_peak():
    assert peak_live([]).step_bytes == 0 and peak_live([]).shares == []
