"""The primitive API reference shown to LLMs, generated from the code's own docstrings (one source of
truth)."""

from __future__ import annotations

import inspect
import re

from .. import primitives
from ..primitives import _values

_GROUPS = (
    ("Declaring and running a fused GEMM", ("epilogue", "gemm", "Config", "schedule")),
    ("Operand pins and statistics", ("ColVecLoad", "RowVecLoad", "HeadRstd")),
    ("Reductions (sinks)", ("ColVecReduce", "RowVecReduce", "OnlineLSEReduce", "ColVecSelect")),
    ("Value math inside an epilogue fn", None),
    ("Host helpers (between GEMMs, on small tensors)", ("rstd_from_sqsum", "rstd_correction")),
    ("Errors", ("EpilogueError",)),
)


def _signature(obj: object, name: str) -> str:
    """``name(a, b=1, *, c=None)``: parameters and defaults, without annotations (the docstrings give the
    types)."""
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return name
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return f"{name}{sig.replace(parameters=params, return_annotation=inspect.Signature.empty)}"


def plain(text: str) -> str:
    """reST markup as plain Markdown: ````x```` and ``:func:`x``` become ```x```."""
    return re.sub(r":(?:func|class|data|meth|mod):`~?([^`]+)`", r"`\1`", text.replace("``", "`"))


def _doc(name: str) -> str:
    return plain(inspect.cleandoc(getattr(primitives, name).__doc__ or "").strip())


def _entry(name: str) -> str:
    obj = getattr(primitives, name)
    kind = "class" if inspect.isclass(obj) else "def"
    return f"### `{kind} {_signature(obj, name)}`\n\n{_doc(name)}\n"


def _value_entry(name: str) -> str:
    """A value function as one list item: its signature, then its docstring's paragraphs run together."""
    text = " ".join(" ".join(_doc(name).split()).split("\n"))
    return f"- `{_signature(getattr(primitives, name), name)}`: {text}"


def api_reference() -> str:
    """Markdown reference of ``coda_agent.primitives``: every public name, by group (the module's overview
    says nothing the contract and the `Config` entry do not, and the worked examples show more than its
    sample)."""
    listed = {n for _, names in _GROUPS if names for n in names}
    value_math = [n for n in primitives.__all__ if n not in listed and n != "Epilogue"]
    parts = ["# coda_agent.primitives — API reference", ""]
    for title, names in _GROUPS:
        parts.append(f"## {title}\n")
        if names is None:  # the value functions: what their GPU precision shares, then one item each
            parts.append(plain(" ".join(_values.PRECISION.split())) + "\n")
            parts.append("\n".join(_value_entry(n) for n in value_math) + "\n")
            continue
        for name in names:
            parts.append(_entry(name))
    return "\n".join(parts).rstrip() + "\n"
