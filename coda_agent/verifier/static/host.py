"""Rules on host expressions: no GEMM outside the primitives, no formatting of values outside a stop's message
(formatting a tensor reads its values), and identity only against singletons and dtypes."""

from __future__ import annotations

import ast

from .check import Check, is_singleton


def no_matmul(node: ast.BinOp | ast.AugAssign, check: Check) -> None:
    if isinstance(node.op, ast.MatMult):
        operator = "@=" if isinstance(node, ast.AugAssign) else "@"
        check.flag(node, f"the {operator} operator is not allowed: the GEMM must run through primitives.gemm")


def percent_format_only_in_stops(node: ast.BinOp, check: Check) -> None:
    if (isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) and isinstance(node.left.value,
                                                                                            str)
            and id(node) not in check.raise_messages):
        check.flag(node, "%-formatting is allowed only in a raise or assert message (formatting a tensor "
                         "reads its values)")


def f_strings_only_in_stops(node: ast.JoinedStr, check: Check) -> None:
    if id(node) not in check.raise_messages and any(isinstance(v, ast.FormattedValue) for v in node.values):
        check.flag(node, "f-strings with values are allowed only in a raise or assert message (formatting a "
                         "tensor reads its values)")


def identity_of_singletons(node: ast.Compare, check: Check) -> None:
    """Object identity tells tensors and devices apart that the checker's runs must not."""
    sides = [node.left, *node.comparators]
    for op, left, right in zip(node.ops, sides, sides[1:], strict=False):
        if isinstance(op, (ast.Is, ast.IsNot)) and not any(is_singleton(side) or (
                isinstance(side, ast.Attribute) and side.attr != "device" and check.place_or_type(side))
                for side in (left, right)):
            check.flag(node,
                       "is / is not may only compare with None, True, False or a dtype (object identity "
                             "tells tensors and devices apart that the checker's runs must not)")
