"""Names as Python scopes them: what each scope binds, which loads are builtins, which bindings rebind a
protected name. The rules trust a name by what it is bound to, so they need the scoping Python applies."""

from __future__ import annotations

import ast
from collections.abc import Collection

from ... import primitives
from .contract import PRIMITIVES

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def outer_parts(scope: ast.AST) -> list[ast.AST]:
    """The parts of a nested scope that the enclosing scope evaluates (decorators, defaults, the first
    iterable)."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = scope.args
        notes = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg,
                                        a.kwarg) if x and x.annotation]
        return [*scope.decorator_list, *a.defaults, *(d for d in a.kw_defaults if d), *notes,
                *([scope.returns] if scope.returns else [])]
    if isinstance(scope, ast.Lambda):
        return [*scope.args.defaults, *(d for d in scope.args.kw_defaults if d)]
    if isinstance(scope, _COMPREHENSIONS):
        return [scope.generators[0].iter]
    if isinstance(scope, ast.ClassDef):
        return [*scope.decorator_list, *scope.bases, *scope.keywords]
    return []


def _inner_parts(scope: ast.AST) -> list[ast.AST]:
    """The parts of a scope that run in it."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
        return list(scope.body)
    if isinstance(scope, ast.Lambda):
        return [scope.body]
    if isinstance(scope, _COMPREHENSIONS):
        first, *rest = scope.generators
        elts = [scope.key, scope.value] if isinstance(scope, ast.DictComp) else [scope.elt]
        return [*elts, first.target, *first.ifs, *rest]
    return []


def _own_nodes(nodes: list[ast.AST]) -> list[ast.AST]:
    """The nodes evaluated in the scope these belong to: nested scopes contribute only their outer parts."""
    out, stack = [], list(nodes)
    while stack:
        node = stack.pop()
        out.append(node)
        nested = isinstance(node, (*_FUNCTIONS, *_COMPREHENSIONS, ast.ClassDef))
        stack.extend(outer_parts(node) if nested else ast.iter_child_nodes(node))
    return out


def scope_bindings(scope: ast.AST) -> set[str]:
    """The names a scope binds itself: its parameters, stores, imports and nested definitions (an annotation
    without a value, ``exec: int``, binds nothing)."""
    names: set[str] = set()
    if isinstance(scope, _FUNCTIONS):
        a = scope.args
        names.update(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x)
    own = _own_nodes(_inner_parts(scope))
    declared_only = {id(n.target) for n in own if isinstance(n, ast.AnnAssign) and n.value is None}
    for node in own:
        if isinstance(node, ast.Name) and isinstance(node.ctx,
                                                     (ast.Store, ast.Del)) and id(node) not in declared_only:
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def builtin_loads(tree: ast.Module) -> set[int]:
    """The ``id`` of every Name load that no binding of the module resolves, scoped as Python scopes names:
    each one is a builtin (or undefined). A parameter named ``exec`` in one function leaves ``exec`` a builtin
    in every other."""
    found: set[int] = set()

    def resolve(scope: ast.AST, chain: list[set[str]]) -> None:
        chain = [*chain, scope_bindings(scope)]
        for node in _own_nodes(_inner_parts(scope)):
            if (
                isinstance(node, ast.Name)
                and isinstance(node.ctx, ast.Load)
                and not any(node.id in env for env in chain)
            ):
                found.add(id(node))
            if isinstance(node, (*_FUNCTIONS, *_COMPREHENSIONS, ast.ClassDef)):
                resolve(node, chain)

    resolve(tree, [])
    return found


def primitive_aliases(tree: ast.Module) -> dict[str, str]:
    """Names bound by ``from coda_agent.primitives import X [as Y]``: Y -> X."""
    return {a.asname or a.name: a.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == PRIMITIVES and not node.level
            for a in node.names if a.name in primitives.__all__}


def rebindings(tree: ast.Module, protected: Collection[str]) -> list[tuple[ast.AST, str]]:
    """Every binding of a protected name (a module or primitive imported at the top, a module-level function)
    besides its own top-level import or def: the checks trust ``torch.x``, ``math.y``, ``relu(...)`` and
    ``helper(...)`` by name, so each name must keep meaning that one thing in every scope."""
    own = {id(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom))}
    found: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names = [node.id]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and id(node) not in own:
            names = [node.name]
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in own:
            names = [(a.asname or a.name).split(".")[0] for a in node.names]
        else:
            continue
        found += [(node, n) for n in names if n in protected]
    return found
