"""The registry of the static check's rules and the one walk that applies them.

Each rule is a function of its family module (``imports``, ``module``, ``definitions``, ``constructs``,
``stores``, ``names``, ``calls``, ``host``, ``epilogue``), named for what it requires; :data:`RULES` says
which nodes each one judges. The walk visits every node once (a function's body under its epilogue state), and
the violations come out sorted and without repeats, so the order of the rules does not matter.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from . import calls, constructs, definitions, epilogue, host, imports, module, names, stores
from .check import Check, Violation
from .contract import BANNED_CONSTRUCTS, EPILOGUE_BANNED
from .parse import UnreadableModule, parse_module
from .scopes import outer_parts

Rule = Callable[[Any, Check], None]

_STORES: tuple[Rule, ...] = (stores.no_attribute_store, stores.inputs_read_only,
                             stores.module_state_read_only)

#: The rules each kind of node is judged by.
RULES: dict[type[ast.AST], tuple[Rule, ...]] = {
    ast.Module: (module.top_level_statements, module.top_level_plain_names, module.top_level_constants,
                 module.defined_once, module.never_rebound, module.forward_defined),
    ast.Import: (imports.allowed_module,),
    ast.ImportFrom: (imports.allowed_from_import,),
    ast.FunctionDef: (definitions.allowed_decorators, definitions.epilogue_called, definitions.schedule_form,
                      definitions.annotations_name_types, definitions.constant_defaults),
    ast.AnnAssign: (*_STORES, definitions.annotations_name_types),
    ast.Assign: _STORES,
    ast.Delete: _STORES,
    ast.AugAssign: (*_STORES, stores.input_not_updated, stores.module_state_not_updated, host.no_matmul,
                    epilogue.epilogue_operators),
    ast.Name: (names.primitive_decorators_in_place, names.no_dunder_name, names.modules_as_namespaces,
               names.allowed_builtin),
    ast.Attribute: (names.primitive_decorators_in_place, names.no_private_attribute,
                    names.module_attribute_allowed, names.methods_only_called, names.no_attribute_chain,
                    names.device_only_places, epilogue.epilogue_reads_modules_only),
    ast.Call: (calls.allowed_builtin_call, calls.allowed_method, calls.module_state_unchanged_by_methods,
               calls.no_named_device, calls.no_tensor_constructor, calls.factory_says_where,
               epilogue.epilogue_calls),
    ast.BinOp: (host.no_matmul, host.percent_format_only_in_stops, epilogue.epilogue_operators),
    ast.JoinedStr: (host.f_strings_only_in_stops,),
    ast.Compare: (host.identity_of_singletons,),
    ast.Subscript: (epilogue.epilogue_constant_index,),
    ast.UnaryOp: (epilogue.epilogue_unary_signs,),
}
for _kind in BANNED_CONSTRUCTS:
    RULES[_kind] = (*RULES.get(_kind, ()), constructs.banned_construct)
for _kind in EPILOGUE_BANNED:
    RULES[_kind] = (*RULES.get(_kind, ()), epilogue.epilogue_control_flow)


def check_source(source: str) -> list[Violation]:
    """All violations of the candidate contract in ``source`` (empty when it may run); never raises on any
    text."""
    try:
        tree = parse_module(source)
    except UnreadableModule as exc:
        return [Violation(exc.lineno or 0, exc.msg)]
    except SyntaxError as exc:
        return [Violation(exc.lineno or 0, f"syntax error: {exc.msg}")]
    try:
        check = Check.of(tree)
        _walk(tree, check)
    except (RecursionError, MemoryError):  # parse_module bounds the depth; this is the last line behind it
        return [Violation(0, "expression nested too deeply for the static check: split it into named parts")]
    return sorted(set(check.violations), key=lambda v: (v.line, v.message))


def _walk(node: ast.AST, check: Check) -> None:
    """Judge ``node`` by its rules, then its children. A function's parts run in its parameters' scope, its
    body under the epilogue rules when it is an epilogue fn or (at the top) a helper one calls."""
    for rule in RULES.get(type(node), ()):
        rule(node, check)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return
    if not isinstance(node, ast.FunctionDef):
        for child in ast.iter_child_nodes(node):
            _walk(child, check)
        return
    is_epilogue = any(check.is_primitive(d.func if isinstance(d, ast.Call) else d,
                                         "epilogue") for d in node.decorator_list)
    is_epilogue = is_epilogue or (not check.in_function and node.name in check.epilogue_helpers)
    a = node.args
    check.params.append({arg.arg for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg,
                                             a.kwarg) if arg})
    check.scopes.append({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx,
                                                                                                ast.Store)})
    for part in outer_parts(node):
        _walk(part, check)
    check.epilogue_depth += is_epilogue
    for stmt in node.body:
        _walk(stmt, check)
    check.epilogue_depth -= is_epilogue
    check.params.pop()
    check.scopes.pop()
