"""The matrix products a task's reference makes, as the task's ``gemms`` list names GEMMs.

The reference runs once on the CPU at the first small shape under a TorchDispatchMode that records each
``aten.mm`` / ``aten.addmm`` it dispatches: its (M, N, K) and how its operands are stored. The cuBLAS baseline
multiplies each listed GEMM in that layout (``measure.baselines``), and ``validate`` refuses a listed GEMM the
reference never makes (every correct kernel would be refused for not running it).
"""

from __future__ import annotations

from typing import Any

from .loader import reference_function, upcast
from .model import Task

#: (M, N, K) -> the first such product's layout: ``"x @ w.T"`` (A stored (M, K), B stored (N, K)),
#: ``"x @ w"``, ``"x.T @ w.T"`` or ``"x.T @ w"`` (A stored (K, M)).
Products = dict[tuple[int, int, int], str]


def reference_products(task: Task) -> tuple[Products, bool]:
    """The products the reference makes at the first small shape, and whether it also made batched ones
    (``aten.bmm``, an einsum's), which have no (M, N, K) of their own to match a listed GEMM against."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    found: Products = {}
    batched = False
    operands = {torch.ops.aten.mm.default: (0, 1), torch.ops.aten.addmm.default: (1, 2)}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            nonlocal batched
            if func in operands:
                a, b = (args[i] for i in operands[func])
                (m, k), n = a.shape, b.shape[1]
                a_stored_km = a.stride(0) == 1 and m > 1
                b_stored_nk = b.stride(0) == 1 and k > 1
                layout = f"x{'.T' if a_stored_km else ''} @ w{'.T' if b_stored_nk else ''}"
                found.setdefault((m, n, k), layout)
            elif func in (torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default):
                batched = True
            return func(*args, **(kwargs or {}))

    point = task.shape("small")[0]
    inputs = upcast(task.make_inputs(point.dims, seed=0))
    with torch.no_grad(), Recorder():
        reference_function(task)(**inputs, **task.constants)
    return found, batched


def row_width_symbols(task: Task, made: Products) -> list[frozenset[str]]:
    """For each listed GEMM, the symbols among M, N and K whose length is a row TMA moves in the reference's
    layout: K (A, or B stored (N, K)) and N (D, or B stored (K, N)) always, and M where the reference stores A
    as (K, M) (a weight gradient's ``dy.t() @ x``) or makes the product the other way round (its D's rows are
    M long). Judged at the first small shape; a GEMM the reference does not make keeps N and K."""
    point = task.shape("small")[0]
    symbols = []
    for m, n, k in task.gemm_shapes(point.dims):
        layout = made.get((m, n, k))
        m_row = (layout is not None and layout.startswith("x.T")) or (layout is None and (n, m, k) in made)
        symbols.append(frozenset({"m", "n", "k"} if m_row else {"n", "k"}))
    return symbols
