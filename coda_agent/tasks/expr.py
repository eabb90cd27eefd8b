"""Tiny, safe arithmetic over shape symbols (``2*M*N*K``, ``1/sqrt(K)``) for task files."""

from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Callable, Mapping

#: The longest expression a task may write (a shape's FLOPs are a line, not a program; deeper ones overflow
#: the parser's recursion).
MAX_LENGTH = 1000
#: The largest power an expression may take, in bits of its result (``9**9**9`` would compute for hours).
MAX_POWER_BITS = 256


def _power(base: float, exponent: float) -> float:
    """``base ** exponent`` where its result is of a size a shape can mean."""
    if abs(base) > 1 and abs(exponent) * math.log2(abs(base)) > MAX_POWER_BITS:
        raise ExprError(f"{base!r} ** {exponent!r} is too large (over 2**{MAX_POWER_BITS})")
    return operator.pow(base, exponent)


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_FUNCS: dict[str, Callable[..., float]] = {"sqrt": math.sqrt, "ceil": math.ceil, "floor": math.floor,
                                           "cdiv": lambda a, b: -(-a // b), "log": math.log}


class ExprError(ValueError):
    """An expression uses something other than numbers, shape symbols, arithmetic and a few functions."""


@functools.lru_cache(maxsize=1024)
def _parsed(expr: str) -> ast.Expression:
    """``expr`` parsed once: a task op evaluates its outputs' shapes at every call (about 10 µs a parse)."""
    if len(expr) > MAX_LENGTH:
        raise ExprError(f"an expression of {len(expr)} characters is longer than the {MAX_LENGTH} allowed "
                        f"({expr[:40]}...)")
    try:
        return ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse {expr!r}: {exc.msg}") from exc


def names(expr: str) -> set[str]:
    """The symbols an expression reads (function names excluded)."""
    tree = _parsed(expr)
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - called


def evaluate(expr: str | int | float, env: Mapping[str, float]) -> float:
    """Evaluate ``expr`` with the symbols in ``env``; numbers pass through."""
    if isinstance(expr, (int, float)):
        return expr
    tree = _parsed(str(expr))

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise ExprError(f"{expr!r} uses unknown symbol {node.id!r} (known: {', '.join(sorted(env))})")
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and not node.keywords
        ):
            return _FUNCS[node.func.id](*(ev(a) for a in node.args))
        raise ExprError(f"{expr!r}: only numbers, shape symbols, + - * / // % ** and {', '.join(_FUNCS)} are "
                        "allowed")

    return ev(tree)
