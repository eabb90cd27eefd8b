"""The primitive API reference shown to LLMs, generated from the code's own docstrings (one source of truth)."""

from __future__ import annotations

import inspect

from .. import primitives

_GROUPS = (
    ("Declaring and running a fused GEMM", ("epilogue", "gemm", "Config", "schedule")),
    ("Operand pins", ("ColVecLoad", "RowVecLoad")),
    ("Reductions (sinks)", ("ColVecReduce", "RowVecReduce", "OnlineLSEReduce", "ColVecSelect")),
    ("Value math inside an epilogue fn", None),
    ("Host helpers (between GEMMs, on small tensors)", ("rstd_from_sqsum", "rstd_correction")),
    ("Errors", ("EpilogueError",)),
)


def _signature(obj: object, name: str) -> str:
    try:
        sig = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        sig = ""
    return f"{name}{sig}"


def _entry(name: str) -> str:
    obj = getattr(primitives, name)
    doc = inspect.cleandoc(obj.__doc__ or "").strip()
    kind = "class" if inspect.isclass(obj) else "def"
    return f"### `{kind} {_signature(obj, name)}`\n\n{doc}\n"


def api_reference() -> str:
    """Markdown reference of ``coda_agent.primitives``: the module overview, then every public name."""
    listed = {n for _, names in _GROUPS if names for n in names}
    value_math = [n for n in primitives.__all__ if n not in listed and n != "Epilogue"]
    parts = ["# coda_agent.primitives — API reference", "", inspect.cleandoc(primitives.__doc__ or ""), ""]
    for title, names in _GROUPS:
        parts.append(f"## {title}\n")
        for name in names if names is not None else value_math:
            parts.append(_entry(name))
    return "\n".join(parts).rstrip() + "\n"
