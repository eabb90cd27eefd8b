"""Rules on function definitions: their decorators (``@epilogue(...)``, and the harness's ``@schedule({...})``
on forward), annotations that only name types, and constant defaults."""

from __future__ import annotations

import ast

from .check import Check, is_constant, names_a_type
from .schedule_form import ScheduleFormError, literal_schedule


def _target(dec: ast.expr) -> ast.expr:
    return dec.func if isinstance(dec, ast.Call) else dec


def allowed_decorators(node: ast.FunctionDef, check: Check) -> None:
    for dec in node.decorator_list:
        if not (check.is_primitive(_target(dec), "schedule") or check.is_primitive(_target(dec), "epilogue")):
            check.flag(dec, "the only decorators allowed are @epilogue(...), and @schedule({...}) on forward")


def epilogue_called(node: ast.FunctionDef, check: Check) -> None:
    """``@epilogue()``, not bare ``@epilogue``, which fails at import."""
    for dec in node.decorator_list:
        if check.is_primitive(dec, "epilogue"):
            check.flag(dec,
                       "write @epilogue() with parentheses (or @epilogue(outputs=..., ...)): bare @epilogue "
                            "raises a TypeError at import")


def schedule_form(node: ast.FunctionDef, check: Check) -> None:
    """``@schedule({...})`` only on the top-level forward, alone, in the literal form."""
    for dec in node.decorator_list:
        if not check.is_primitive(_target(dec), "schedule"):
            continue
        if node.name != "forward" or check.in_function or len(node.decorator_list) != 1:
            check.flag(dec, "@schedule({...}) may only decorate the top-level forward, as its only decorator")
        elif not isinstance(dec, ast.Call):
            check.flag(dec, "schedule must be called with its table: @schedule({(epilogue_name, M, N, K): "
                            "Config(...)})")
        else:
            config_names = {f"{p}.Config" for p in check.prims} | {y for y, x in check.prim_aliases.items()
                                                                   if x == "Config"}
            try:
                literal_schedule(dec, config_names)
            except ScheduleFormError as exc:
                check.flag(dec, str(exc))


def annotations_name_types(node: ast.FunctionDef | ast.AnnAssign, check: Check) -> None:
    """Annotations name types; they run at import (without the future import), so nothing else may be in
    them."""
    if isinstance(node, ast.AnnAssign):
        if not names_a_type(node.annotation):
            check.flag(node, f"the annotation {ast.unparse(node.annotation)!r} must only name types")
        return
    a = node.args
    notes = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg,
                                    a.kwarg) if x and x.annotation]
    for note in [*notes, *([node.returns] if node.returns else [])]:
        if not names_a_type(note):
            check.flag(note, f"the annotation {ast.unparse(note)!r} must only name types (torch.Tensor, "
                             "dict[str, int], float | None)")


def constant_defaults(node: ast.FunctionDef, check: Check) -> None:
    for default in (*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)):
        if not is_constant(default):
            check.flag(default, "default values must be constants (None, numbers, strings, tuples): a "
                                "mutable default keeps state across calls")
