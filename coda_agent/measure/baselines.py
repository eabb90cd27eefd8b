"""The baselines a kernel is timed against, per task and shape.

* ``eager``: the task's reference called on task-dtype inputs (unfused PyTorch, cuBLAS GEMMs);
* ``compiled``: ``torch.compile`` of the same function (Inductor defaults, static shapes);
* ``compiled_max_autotune``: the same with ``mode="max-autotune-no-cudagraphs"`` (Inductor autotunes its GEMM
  templates against cuBLAS; slow to compile, so only the bench asks for it);
* ``cublas``: only the task's GEMMs (its ``gemms`` field) through ``torch.mm``, the practical floor, each in
  the layout the reference multiplies it in (:func:`gemm_layouts`: a dgrad's ``dz @ w`` reads an N-major
  weight, ``x @ w.T`` a K-major one, and cuBLAS's speed can differ between the two).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from ..tasks.loader import reference_function
from ..tasks.model import Task, torch_dtype
from ..tasks.products import reference_products

if TYPE_CHECKING:  # torch is imported where a baseline runs: naming the baselines stays fast
    import torch


def gemm_dtype(task: Task) -> torch.dtype:
    """The GEMMs' operand dtype: the first 16-bit floating input's (bf16 when there is none)."""
    import torch

    for spec in task.inputs:
        dt = torch_dtype(spec.dtype)
        if dt in (torch.bfloat16, torch.float16):
            return dt
    return torch.bfloat16


#: Every baseline a kernel may be timed against, by the name timings carry, with the label people read.
BASELINES = {
    "eager": "eager",
    "compiled": "torch.compile",
    "compiled_max_autotune": "torch.compile max-autotune",
    "cublas": "cuBLAS alone",
}

#: torch.compile modes a bench may time, by the baseline name each is reported under.
COMPILE_MODES = {"default": "compiled", "max-autotune-no-cudagraphs": "compiled_max_autotune"}


#: While Inductor compiles, torch.fx raises a process-wide "tracing" flag, and a compiled function entered
#: meanwhile from another thread raises ("using FX to symbolically trace a dynamo-optimized function"). The
#: bench's checks compile references on several threads at once (two tasks lost their check to it on the H200,
#: 2026-12-02), so every call of a compiled reference, the compiling ones included, holds this lock. It costs
#: the checks little: Dynamo compiles one frame at a time anyway (``convert_frame.compile_lock``). A timed
#: call never waits on it: a timed job runs alone on its GPU's process (:mod:`coda_agent.execute`).
_INDUCTOR = threading.Lock()


def compiled_reference(task: Task, mode: str = "default") -> Callable[..., Any]:
    """``torch.compile`` of the reference, one static graph per shape (no recompile limit in the way).

    Inductor compiles in-process: these graphs hold one to three small Triton kernels, and the bench runs
    several workers at once, so a compile pool per worker would cost more to start than it saves.
    """
    import torch._dynamo
    import torch._inductor.config

    torch._inductor.config.compile_threads = 1
    cfg = torch._dynamo.config
    if hasattr(cfg, "recompile_limit"):
        cfg.recompile_limit = max(cfg.recompile_limit, 64)
    else:  # older torch
        cfg.cache_size_limit = max(cfg.cache_size_limit, 64)
    compiled = torch.compile(reference_function(task), dynamic=False,
                             mode=None if mode == "default" else mode)

    def call(*args: Any, **kwargs: Any) -> Any:
        with _INDUCTOR:
            return compiled(*args, **kwargs)

    return call


#: How a GEMM's operands are stored, as the product reads in PyTorch: A (M, K) or its transpose stored (K, M),
#: times B stored (N, K) (an nn.Linear weight, used transposed) or (K, N).
Layout = Literal["x @ w.T", "x @ w", "x.T @ w.T", "x.T @ w"]
DEFAULT_LAYOUT: Layout = "x @ w.T"


#: :func:`gemm_layouts` per task file: the reference runs once per process.
_LAYOUTS: dict[tuple[Path, int, str], tuple[Layout, ...]] = {}


def gemm_layouts(task: Task) -> tuple[Layout, ...]:
    """The layout of each of the task's GEMMs as its reference multiplies: the reference is run once on the
    CPU at the first small shape, and each matrix product it makes whose (M, N, K) is an entry of ``gemms``
    there gives that entry its operands' storage (their strides). An entry no product matches keeps
    :data:`DEFAULT_LAYOUT`."""
    key = (task.path, task.version, repr(task.gemms))
    if key not in _LAYOUTS:
        _LAYOUTS[key] = _traced_layouts(task)
    return _LAYOUTS[key]


def _traced_layouts(task: Task) -> tuple[Layout, ...]:
    found, _ = reference_products(task)
    wanted = task.gemm_shapes(task.shape("small")[0].dims)
    return tuple(cast(Layout, found.get(mnk, DEFAULT_LAYOUT)) for mnk in wanted)


def cublas_gemms(task: Task, dims: dict[str, int], device: str = "cuda") -> Callable[[], object] | None:
    """The task's GEMMs alone, each in its layout (:func:`gemm_layouts`); None when the task lists none."""
    shapes = task.gemm_shapes(dims)
    if not shapes:
        return None
    import torch

    dt = gemm_dtype(task)
    gen = torch.Generator(device=device).manual_seed(0)

    def operand(rows: int, cols: int, transposed: bool, scale: float = 1.0) -> torch.Tensor:
        """A (rows, cols) operand, stored transposed (cols, rows) when ``transposed``."""
        shape = (cols, rows) if transposed else (rows, cols)
        t = torch.randn(shape, device=device, dtype=dt, generator=gen) * scale
        return t.t() if transposed else t

    ops = [(operand(m, k, layout.startswith("x.T")), operand(k, n, layout.endswith("w.T"), k**-0.5))
           for (m, n, k), layout in zip(shapes, gemm_layouts(task), strict=True)]

    def run() -> object:
        return [torch.mm(a, b) for a, b in ops]

    return run


def baseline_variants(
    task: Task, dims: dict[str, int], inputs: dict[str, torch.Tensor], device: str = "cuda",
    compile_modes: Sequence[str] = (),
) -> dict[str, Callable[[], object]]:
    """Name -> zero-argument callable for every baseline that applies to this task and shape."""
    ref = reference_function(task)
    out: dict[str, Callable[[], object]] = {"eager": lambda: ref(**inputs, **task.constants)}
    for mode in compile_modes:
        comp = compiled_reference(task, mode)
        out[COMPILE_MODES[mode]] = functools.partial(comp, **inputs, **task.constants)
    gemms = cublas_gemms(task, dims, device)
    if gemms is not None:
        out["cublas"] = gemms
    return out
