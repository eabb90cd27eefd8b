"""Backend selection: the harness picks how ``gemm`` runs; candidate code never does.

* ``torch``: the FP32 emulator (any device; the CPU check of a candidate's algebra);
* ``quack``: real fused kernels through QuACK (needs an SM90+ GPU);
* ``quack-compile``: compile the kernels for sm_90a without launching (no GPU needed);
* ``shapes``: results shaped as the kernels' would be, nothing computed (forward() on meta tensors).

This module is not part of the candidate surface (``coda_agent.primitives.__all__``); the static check
rejects candidates that import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ._call import GemmCall, Runner

BACKENDS = ("torch", "quack", "quack-compile", "shapes")


@dataclass(frozen=True)
class Backend:
    """A named way to execute a :class:`GemmCall`."""

    name: str
    run: Runner


def _shapes_only(call: GemmCall) -> dict[str, torch.Tensor]:
    """The results' shapes only, nothing built or run: how the checker learns, on meta tensors, which gemm
    calls (and configs) forward() makes at shapes too large to run on a CPU."""
    out, reduced = call.zero_results()
    return {**out, **reduced}


def _make(name: str) -> Backend:
    if name == "torch":
        from . import _emulator

        return Backend(name, _emulator.run)
    if name == "quack":
        from . import _quack

        return Backend(name, _quack.run)
    if name == "quack-compile":
        from . import _quack

        return Backend(name, _quack.run_compile_only)
    if name == "shapes":
        return Backend(name, _shapes_only)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


_active: list[Backend] = [_make("torch")]


def active() -> Backend:
    """The backend ``gemm`` runs on now."""
    return _active[-1]


def set_backend(name: str, wrap: Callable[[Runner], Runner] | None = None) -> Backend:
    """Select the backend for the rest of the process (the harness calls this before loading a candidate).

    ``wrap`` lets the harness observe every gemm call (the CPU runner logs them for the launch estimate).
    """
    made = _make(name)
    _active[-1] = made if wrap is None else Backend(made.name, wrap(made.run))
    return _active[-1]


def preload(name: str) -> None:
    """Import what a first launch on backend ``name`` needs (QuACK, the CuTe DSL, the load-ahead kernel), so
    that it can happen beside other work: a runner does it while the checker draws and sends the inputs."""
    if name in ("quack", "quack-compile"):
        from . import _quack

        _quack.preload()


@contextmanager
def using(name: str, run: Runner | None = None,
          wrap: Callable[[Runner], Runner] | None = None) -> Iterator[Backend]:
    """Run a block on another backend, then restore the previous one.

    ``run`` runs the block's gemm calls instead, as backend ``name`` (the tuner's wrappers of the QuACK
    backend); ``wrap`` observes them, as for :func:`set_backend`.
    """
    made = _make(name) if run is None else Backend(name, run)
    _active.append(made if wrap is None else Backend(made.name, wrap(made.run)))
    try:
        yield _active[-1]
    finally:
        _active.pop()
