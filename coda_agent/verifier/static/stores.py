"""Rules on what a candidate writes: no attribute anywhere, no item of an input or of a module-level name, no
in-place update of either."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .check import Check


def _targets(node: ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete) -> Iterator[ast.expr]:
    """Every place the statement writes, unpacked (``a, (b.x, *c[0]) = ...``)."""
    todo: list[ast.expr] = list(node.targets) if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
    while todo:
        target = todo.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            todo.extend(target.elts)
        elif isinstance(target, ast.Starred):
            todo.append(target.value)
        else:
            yield target


def _root(target: ast.Subscript) -> ast.expr:
    root = target.value
    while isinstance(root, (ast.Subscript, ast.Attribute)):
        root = root.value
    return root


def no_attribute_store(node: ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete, check: Check) -> None:
    for target in _targets(node):
        if isinstance(target, ast.Attribute):
            check.flag(target, f"assigning to an attribute ({ast.unparse(target)}) is not allowed: no state "
                               "on objects, modules or tensors")


def inputs_read_only(node: ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete, check: Check) -> None:
    for target in _targets(node):
        root = _root(target) if isinstance(target, ast.Subscript) else None
        if isinstance(root, ast.Name) and check.is_input(root.id):
            check.flag(target, f"writing into the input {root.id!r} is not allowed: inputs are read-only")


def module_state_read_only(node: ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete,
                           check: Check) -> None:
    for target in _targets(node):
        root = _root(target) if isinstance(target, ast.Subscript) else None
        if isinstance(root, ast.Name) and not check.is_input(root.id) and check.is_module_state(root.id):
            check.flag(target,
                       f"writing into the module-level {root.id!r} is not allowed (state across calls)")


def input_not_updated(node: ast.AugAssign, check: Check) -> None:
    if isinstance(node.target, ast.Name) and check.is_input(node.target.id):
        check.flag(node, f"'{node.target.id} {ast.unparse(node.op)}= ...' updates an input in place; write "
                         f"'y = {node.target.id} ...' instead")


def module_state_not_updated(node: ast.AugAssign, check: Check) -> None:
    if isinstance(node.target, ast.Name) and check.is_module_state(node.target.id):
        check.flag(node, f"updating the module-level {node.target.id!r} is not allowed (state across calls)")
