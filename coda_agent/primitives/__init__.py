"""The constrained primitive API candidates (human or LLM) write kernels against.

A candidate declares an epilogue over the FP32 accumulator of a GEMM and calls it. For example,
a projection with a bias, a tanh-GELU and a per-row absolute maximum (say, for a later FP8 scale)::

    from coda_agent.primitives import ColVecReduce, RowVecLoad, epilogue, gemm, gelu_tanh

    @epilogue(operands={"bias": RowVecLoad()}, reduces={"amax": ColVecReduce(combine="max_abs")})
    def bias_gelu_amax(acc, bias):
        y = gelu_tanh(acc + bias)
        return {"D": y, "amax": y}

    def forward(x, w, bias):
        out = gemm(bias_gelu_amax, x, w.t(), bias=bias)   # w stored (N, K): B = w.t() is (K, N)
        return {"y": out["D"], "amax": out["amax"]}

The same code runs on the torch emulator (CPU) and as a QuACK kernel (GPU); the harness chooses. The
harness also owns the schedule: it tunes each gemm call's :class:`Config` and pins the winners on
``forward`` with :func:`schedule`.

Layers, each module importing only those below it (tests/test_layering.py holds the graph acyclic):

* ``_config`` (Config and its SM90 rules, torch-free), ``_ops`` (pins, sinks), ``_values`` (value math),
  ``host``, ``quack_patches``: leaves;
* ``_call``: one call as every backend takes it (Epilogue, GemmCall); ``_schedule``: ``@schedule``'s pins;
* ``configs``: the config space, the default and the config a call runs with (``chosen_config``); ``backend``:
  which backend runs a call;
* ``_emulator``, ``_quack`` (and its load-ahead kernel, ``_ahead``): the backends, loaded when picked;
* ``_epilogue``: ``epilogue()`` and ``gemm()``, the front end, which checks a call and hands it to the
  backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._call import Epilogue
    from ._config import Config, EpilogueError
    from ._epilogue import epilogue, gemm
    from ._ops import (
        ColVecLoad,
        ColVecReduce,
        ColVecSelect,
        HeadRstd,
        OnlineLSEReduce,
        RowVecLoad,
        RowVecReduce,
    )
    from ._schedule import schedule
    from ._values import (
        cos,
        dswiglu,
        erf,
        exp,
        gelu_tanh,
        log,
        maximum,
        minimum,
        pack,
        relu,
        rsqrt,
        sigmoid,
        silu,
        sin,
        sqrt,
        swiglu,
        tanh,
        unpack,
    )
    from .host import rstd_correction, rstd_from_sqsum

__all__ = [
    "ColVecLoad",
    "ColVecReduce",
    "ColVecSelect",
    "Config",
    "Epilogue",
    "EpilogueError",
    "HeadRstd",
    "OnlineLSEReduce",
    "RowVecLoad",
    "RowVecReduce",
    "cos",
    "dswiglu",
    "epilogue",
    "erf",
    "exp",
    "gelu_tanh",
    "gemm",
    "log",
    "maximum",
    "minimum",
    "pack",
    "relu",
    "rsqrt",
    "rstd_correction",
    "rstd_from_sqsum",
    "schedule",
    "sigmoid",
    "silu",
    "sin",
    "sqrt",
    "swiglu",
    "tanh",
    "unpack",
]

#: The submodule of each public name. They load on first use (PEP 562): most import torch, and a verdict or a
#: run record that names a :class:`Config` must load without it (listing tasks and results stays fast).
_HOME = {"Config": "_config", "EpilogueError": "_config", "Epilogue": "_call", "epilogue": "_epilogue",
         "gemm": "_epilogue", "schedule": "_schedule", "rstd_correction": "host", "rstd_from_sqsum": "host",
         **dict.fromkeys(("ColVecLoad", "ColVecReduce", "ColVecSelect", "HeadRstd", "OnlineLSEReduce",
                          "RowVecLoad", "RowVecReduce"), "_ops")}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME.get(name, '_values')}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
