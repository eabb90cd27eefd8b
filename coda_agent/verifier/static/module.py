"""Rules on the module as a whole: imports, functions and constants at the top, each name meaning one thing,
and a ``forward``."""

from __future__ import annotations

import ast

from .check import Check, Violation, number_expr
from .contract import CONST_NODES, DECLARATIONS
from .scopes import rebindings

_TOP_LEVEL = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Assign, ast.AnnAssign, ast.Expr)


def top_level_statements(tree: ast.Module, check: Check) -> None:
    """Imports, functions, constant assignments and the docstring: nothing at the top runs code."""
    for node in tree.body:
        if isinstance(node, ast.Expr) and not (isinstance(node.value, ast.Constant)
                                               and isinstance(node.value.value, str)):
            check.flag(node, "top-level expressions other than the docstring are not allowed")
        elif not isinstance(node, _TOP_LEVEL):
            check.flag(node, f"top-level {type(node).__name__} statements are not allowed (imports, "
                             "functions and constants only)")


def top_level_plain_names(tree: ast.Module, check: Check) -> None:
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(not isinstance(t, ast.Name) for t in targets):
                check.flag(node, "top-level assignments must bind plain names")


def top_level_constants(tree: ast.Module, check: Check) -> None:
    """A module-level value is a constant or a frozen declaration: a place to keep state across calls is not.
    Declarations are recognised by their bare imported names only (``P.Config(...)`` at the top is
    refused)."""
    math_names = {a.asname or a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names
                  if a.name == "math"}
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        value = node.value
        numbers = {id(sub) for n in ast.walk(value) if isinstance(n, ast.Call) and number_expr(n, math_names)
                   for sub in ast.walk(n)}  # math.sqrt(2 / math.pi): a float constant
        bad = [n for n in ast.walk(value) if not isinstance(n, CONST_NODES)]
        calls = [n for n in ast.walk(value) if isinstance(n, ast.Call) and id(n) not in numbers
                 and not (isinstance(n.func, ast.Name) and check.prim_aliases.get(n.func.id) in DECLARATIONS)]
        if bad or calls:
            check.flag(node, "top-level assignments must be constants (literals, tuples, dicts, math on "
                             "numbers such as math.sqrt(2 / math.pi), declarations such as Config(...) or "
                             "RowVecLoad()): no tensors, values or other state")


def _protected(tree: ast.Module, check: Check) -> set[str]:
    """The names the rules trust by what they are bound to: imports and the module's functions."""
    return (set(check.prim_aliases) | check.torch | check.math | check.prims
            | {n.name for n in tree.body if isinstance(n, ast.FunctionDef)})


def defined_once(tree: ast.Module, check: Check) -> None:
    protected = _protected(tree, check)
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] + [
        (a.asname or a.name).split(".")[0] for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names]
    defined = [d for d in defined if d in protected]
    for name in {d for d in defined if defined.count(d) > 1}:
        check.flag(tree,
                   f"{name!r} is defined or imported twice: each function and primitive has one meaning")


def never_rebound(tree: ast.Module, check: Check) -> None:
    for site, name in rebindings(tree, _protected(tree, check)):
        check.flag(site, f"{name!r} names an import or one of the module's functions: it may not be rebound")


def forward_defined(tree: ast.Module, check: Check) -> None:
    if not any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in tree.body):
        check.violations.append(Violation(0, "the module must define a top-level function forward(**inputs)"))
