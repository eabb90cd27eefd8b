"""Rules on imports: only ``coda_agent.primitives``, ``math`` and ``torch``, by name."""

from __future__ import annotations

import ast

from ... import primitives
from .check import Check
from .contract import FUTURE_IMPORTS, PRIMITIVES

_ONLY = "(only coda_agent.primitives, math, torch)"


def allowed_module(node: ast.Import, check: Check) -> None:
    """``import m``: torch, math, or the primitives under a name of their own."""
    for alias in node.names:
        if alias.name not in ("torch", "math") and not (alias.name == PRIMITIVES and alias.asname):
            check.flag(node, f"import of {alias.name!r} is not allowed {_ONLY}")


def allowed_from_import(node: ast.ImportFrom, check: Check) -> None:
    """``from m import x``: absolute, from an allowed module, of names that module offers a candidate."""
    mod = node.module or ""
    if node.level:
        check.flag(node, "relative imports are not allowed")
    elif mod == "__future__":
        for a in node.names:
            if a.name not in FUTURE_IMPORTS:
                check.flag(node, f"from __future__, only {', '.join(sorted(FUTURE_IMPORTS))} may be imported")
    elif mod == "coda_agent":
        if any(a.name != "primitives" for a in node.names):
            check.flag(node, "from coda_agent, only 'primitives' may be imported")
    elif mod == PRIMITIVES:
        for a in node.names:
            if a.name == "*":
                check.flag(node, "star imports are not allowed; import the names you use")
            elif a.name not in primitives.__all__:
                check.flag(node, f"{a.name!r} is not part of coda_agent.primitives (see the API reference)")
    elif mod == "math":
        for a in node.names:
            if a.name == "*" or a.name.startswith("_"):
                check.flag(node, f"from math, {a.name!r} may not be imported")
    else:
        check.flag(node, f"import from {mod!r} is not allowed {_ONLY}")
