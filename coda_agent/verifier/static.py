"""The static check: an allowlist for candidate modules, checked on the AST before anything runs.

A candidate may import the public names of ``coda_agent.primitives``, ``math`` and ``torch``, and must define
``forward``. Host glue may call the torch functions in :data:`TORCH_FUNCTIONS`, the methods in
:data:`METHODS` and the builtins in :data:`BUILTINS`; everything else is refused: any other attribute chain
(``torch.serialization.os``…), a method taken as a value, dunder or private access, assignment to an
attribute anywhere or to an item of an input or a module-level name, mutable defaults, classes,
``global``/``nonlocal``, ``try``, ``with``, generators, and top-level code other than imports, functions
and constant declarations. Names resolve as Python scopes them (:func:`builtin_loads`): a builtin is a builtin
however the module names its parameters. Host code may not tell where it runs (``.device`` only places new
tensors; no formatting of values outside a ``raise``), so forward() on meta tensors does what it does on a
GPU. An epilogue fn's body may call only the primitives' value functions and ``math``: the same fn runs on the
emulator's tensors and as the GPU's symbolic values, and must not tell them apart. The one decorator besides
``@epilogue(...)`` is the harness's pinned schedule on ``forward``, in exactly the form
:func:`literal_schedule` reads. The contract text of the prompt is generated from these tables.

This is the first line, not the only one: the runner is sandboxed and the checker judges what it returns.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from .. import primitives
from ..primitives import Config, _values

PRIMITIVES = "coda_agent.primitives"
ALLOWED_MODULES = ("math", "torch", PRIMITIVES)

#: torch functions host glue may call (elementwise math, reductions, creation, shape and indexing; no GEMMs).
TORCH_FUNCTIONS = frozenset({
    "abs", "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "neg", "negative", "rsub",
    "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "pow", "square", "reciprocal", "sigmoid",
    "tanh", "sin", "cos", "erf", "sign", "floor", "ceil", "round", "trunc", "clamp", "clip", "minimum", "maximum",
    "where", "lerp", "addcmul", "addcdiv", "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin",
    "logsumexp", "cumsum", "isfinite", "isnan", "isinf", "nan_to_num", "zeros", "ones", "full", "empty",
    "zeros_like", "ones_like", "full_like", "empty_like", "arange", "tensor", "cat", "concat", "stack", "gather",
    "index_select", "take_along_dim", "reshape", "flatten", "squeeze", "unsqueeze", "transpose", "permute",
    "chunk", "split", "narrow", "broadcast_to", "repeat_interleave", "flip", "roll", "tril", "triu",
    "softmax", "log_softmax", "eq", "ne", "lt", "le", "gt", "ge",
})
#: torch attributes that are values, not functions (dtypes).
TORCH_VALUES = frozenset({
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool", "float",
    "half", "double", "long", "int", "Tensor",
})
#: The torch dtypes (``TORCH_VALUES`` less the ``Tensor`` type).
TORCH_DTYPES = TORCH_VALUES - {"Tensor"}
#: Methods host glue may call on tensors, dicts and lists.
METHODS = frozenset({
    "t", "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "contiguous", "expand", "expand_as",
    "flatten", "unflatten", "squeeze", "unsqueeze", "chunk", "split", "narrow", "unbind", "repeat", "size", "dim",
    "numel", "stride", "float", "half", "bfloat16", "double", "int", "long", "bool", "to", "type_as", "clone",
    "detach", "new_zeros", "new_ones", "new_full", "new_empty", "masked_fill", "fill_", "zero_", "copy_",
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "neg_", "abs", "exp", "exp_", "log",
    "log1p", "sqrt", "rsqrt", "rsqrt_", "pow", "square", "reciprocal", "sigmoid", "tanh", "sin", "cos", "clamp",
    "clamp_", "clamp_min", "clamp_max", "sum", "mean", "amax", "amin", "max", "min", "argmax", "logsumexp",
    "cumsum", "gather", "index_select", "isfinite", "isnan", "nan_to_num", "where", "lerp", "roll", "flip",
    "is_contiguous", "eq", "ne", "lt", "le", "gt", "ge",
    "get", "items", "keys", "values", "append", "extend", "update", "pop", "copy", "index", "count",
})
#: Attributes that may be read without calling them (``device`` only as a new tensor's ``device=``).
DATA_ATTRS = frozenset({"shape", "dtype", "device", "T", "mT", "ndim"})
#: Builtins a candidate may name.
BUILTINS = frozenset({
    "len", "range", "min", "max", "abs", "sum", "round", "divmod", "pow", "int", "float", "bool", "tuple",
    "list", "dict", "set", "frozenset", "zip", "enumerate", "map", "filter", "sorted", "reversed", "any", "all",
    "isinstance", "slice", "print", "iter", "next", "True", "False", "None", "ValueError", "RuntimeError",
    "TypeError", "AssertionError", "NotImplementedError",
})
#: What an epilogue fn's body may call: the primitives' value functions (``math`` too, on Python numbers).
EPILOGUE_FUNCTIONS = frozenset(_values.__all__) & frozenset(primitives.__all__)
#: Builtins an epilogue fn's body may call (on Python numbers).
EPILOGUE_BUILTINS = frozenset({"float", "int"})
#: The torch functions and tensor methods that make a tensor, whose ``device=`` may be ``x.device``.
PLACING = frozenset({"to", "new_zeros", "new_ones", "new_full", "new_empty", "zeros", "ones", "full", "empty",
                     "zeros_like", "ones_like", "full_like", "empty_like", "arange", "tensor"})
#: The torch functions that make a tensor from nothing: they must say where (``device=x.device``).
FACTORIES = frozenset({"zeros", "ones", "full", "empty", "arange", "tensor"})
#: What an annotation may be built from: names, dotted names, subscripts, tuples and constants (and ``|``).
_TYPE_NODES = (ast.Name, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.Constant, ast.Load, ast.BitOr)
#: Binary operators an epilogue fn's values support alike on the emulator and the GPU (``%``, ``//``, ``**`` differ).
EPILOGUE_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div)
#: Control flow on values that the emulator's tensors and the GPU's symbolic values do not share.
_EPILOGUE_BANNED: dict[type, str] = {
    ast.Compare: "comparisons", ast.BoolOp: "and/or", ast.IfExp: "conditional expressions", ast.If: "if statements",
    ast.While: "while loops", ast.For: "for loops", ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions", ast.GeneratorExp: "generator expressions", ast.Starred: "starred expressions",
}
_OP_SYMBOLS = {ast.Mod: "%", ast.FloorDiv: "//", ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
               ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
#: Builtins that may name a type in an annotation (``-> dict[str, torch.Tensor]``), though not be called.
ANNOTATION_BUILTINS = frozenset({"str", "object", "type"})
#: The one future import: it changes no semantics a check relies on.
FUTURE_IMPORTS = frozenset({"annotations"})
#: The primitives a top-level constant may call: frozen declarations (a value function such as ``pack`` or ``exp``
#: would make a mutable object, a place to keep state across calls).
DECLARATIONS = frozenset({"Config", "ColVecLoad", "ColVecReduce", "ColVecSelect", "OnlineLSEReduce", "RowVecLoad",
                          "RowVecReduce"})
#: Top-level values a constant declaration may be built from (besides literals and primitives' names).
_CONST_NODES = (ast.Constant, ast.Tuple, ast.List, ast.Dict, ast.Set, ast.UnaryOp, ast.BinOp, ast.Name, ast.Load,
                ast.keyword, ast.operator, ast.unaryop, ast.Attribute, ast.Call, ast.Subscript, ast.Slice)


#: The longest module the static check reads (a kernel is a few kB; a reply the size of a book is not one).
MAX_SOURCE_CHARS = 500_000
#: The deepest a module's syntax tree may nest. A kernel stays under 20 levels; Python's own recursive tools
#: (``ast.unparse``, the compiler, a ``NodeVisitor``) give up near 1000, so a 1,200-term sum must stop here.
MAX_DEPTH = 100


class UnreadableModule(SyntaxError):
    """Source the static check does not read: too large, nested too deeply, NUL bytes, or beyond Python's parser
    (which raises RecursionError or MemoryError on such text, not SyntaxError). ``msg`` says which."""


def nesting_depth(tree: ast.AST) -> tuple[int, int]:
    """The depth of ``tree``'s deepest node and its line, found without recursion (so any depth is measured)."""
    deepest, line = 0, 0
    stack: list[tuple[ast.AST, int, int]] = [(tree, 1, 0)]
    while stack:
        node, depth, at = stack.pop()
        at = getattr(node, "lineno", at)
        if depth > deepest:
            deepest, line = depth, at
        stack.extend((child, depth + 1, at) for child in ast.iter_child_nodes(node))
    return deepest, line


def parse_module(source: str) -> ast.Module:
    """The syntax tree of untrusted ``source``. Raises SyntaxError for a syntax error and :class:`UnreadableModule`
    (a SyntaxError too) for text no check should walk: every caller that catches SyntaxError is safe from it."""
    if len(source) > MAX_SOURCE_CHARS:
        raise UnreadableModule(f"the module is {len(source):,} characters long; at most {MAX_SOURCE_CHARS:,} are read")
    try:
        tree = ast.parse(source)
    except (RecursionError, MemoryError):
        raise UnreadableModule(
            "expression nested too deeply for Python's parser: split long sums and chains into named parts"
        ) from None
    except ValueError as exc:  # NUL bytes (Python 3.11 raises ValueError; 3.12 a SyntaxError)
        raise UnreadableModule(f"the module cannot be parsed: {exc}") from None
    depth, line = nesting_depth(tree)
    if depth > MAX_DEPTH:
        err = UnreadableModule(
            f"expression nested too deeply ({depth} levels, at most {MAX_DEPTH}): split long sums and chains into "
            "named parts"
        )
        err.lineno = line
        raise err
    return tree


@dataclass(frozen=True)
class Violation:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class ScheduleFormError(ValueError):
    """A ``@schedule(...)`` that is not a literal table of ``(name, M, N, K): Config(field=constant, ...)``."""


def literal_schedule(call: ast.Call, config_names: Collection[str] = ("Config",)) -> dict[tuple[str, int, int, int], Config]:
    """The table of a ``schedule({...})`` call, read from its literal source without running anything.

    The one form accepted (and the one the harness writes): a single dict literal whose keys are
    ``("epilogue_name", M, N, K)`` tuples of constants and whose values are ``Config(...)`` calls (``config_names``:
    how the module names Config) with constant keyword fields. Raises :class:`ScheduleFormError` otherwise.
    """
    if len(call.args) != 1 or call.keywords or not isinstance(call.args[0], ast.Dict):
        raise ScheduleFormError("schedule() takes exactly one argument, a dict literal {(epilogue_name, M, N, K): Config(...)}")
    fields = {f.name: bool if f.type in (bool, "bool") else int for f in dataclasses.fields(Config)}
    flags = ", ".join(sorted(name for name, kind in fields.items() if kind is bool))
    table: dict[tuple[str, int, int, int], Config] = {}
    for k, v in zip(call.args[0].keys, call.args[0].values, strict=True):
        try:
            key = ast.literal_eval(k) if k is not None else None
        except (ValueError, TypeError, SyntaxError, RecursionError):
            key = None
        ok_key = (
            isinstance(key, tuple) and len(key) == 4 and isinstance(key[0], str)
            and all(type(d) is int and d > 0 for d in key[1:])
        )
        if not ok_key:
            raise ScheduleFormError("schedule keys must be literal (epilogue_name, M, N, K) tuples with positive integer dims")
        assert isinstance(key, tuple)
        if not (isinstance(v, ast.Call) and ast.unparse(v.func) in config_names and not v.args):
            raise ScheduleFormError(f"schedule entry {key!r} must be Config(field=value, ...) with keyword fields")
        values: dict[str, object] = {}
        for kw in v.keywords:
            if kw.arg not in fields or not isinstance(kw.value, ast.Constant) or type(kw.value.value) is not fields[kw.arg]:
                raise ScheduleFormError(f"schedule entry {key!r}: Config fields are {', '.join(sorted(fields))}, each a constant integer ({flags}: True/False)")
            values[kw.arg] = kw.value.value
        if key in table:
            raise ScheduleFormError(f"schedule key {key!r} appears twice")
        table[key] = Config(**values)  # type: ignore[arg-type]
    return table


def without_schedule(source: str) -> str:
    """The module with forward's ``@schedule`` (and the names it imports for it) taken out, as normalised source:
    what two candidates that differ only in their pinned schedule have in common."""
    try:
        tree = parse_module(source)
    except SyntaxError:
        return source
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "forward":
            node.decorator_list = [d for d in node.decorator_list if not (isinstance(d, ast.Call) and ast.unparse(d.func).split(".")[-1] == "schedule")]
        elif isinstance(node, ast.ImportFrom) and node.module == PRIMITIVES:
            node.names = [a for a in node.names if a.name not in ("Config", "schedule")]
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and not n.names)]
    try:
        return ast.unparse(tree)
    except RecursionError:
        return source


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _outer_parts(scope: ast.AST) -> list[ast.AST]:
    """The parts of a nested scope that the enclosing scope evaluates (decorators, defaults, the first iterable)."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = scope.args
        notes = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x and x.annotation]
        return [*scope.decorator_list, *a.defaults, *(d for d in a.kw_defaults if d), *notes, *([scope.returns] if scope.returns else [])]
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
        stack.extend(_outer_parts(node) if nested else ast.iter_child_nodes(node))
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
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) and id(node) not in declared_only:
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def builtin_loads(tree: ast.Module) -> set[int]:
    """The ``id`` of every Name load that no binding of the module resolves, scoped as Python scopes names: each
    one is a builtin (or undefined). A parameter named ``exec`` in one function leaves ``exec`` a builtin in
    every other."""
    found: set[int] = set()

    def resolve(scope: ast.AST, chain: list[set[str]]) -> None:
        chain = [*chain, scope_bindings(scope)]
        for node in _own_nodes(_inner_parts(scope)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and not any(node.id in env for env in chain):
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


def _is_singleton(node: ast.AST) -> bool:
    """``None``, ``True`` or ``False`` written out (not ``0``, which equals False)."""
    return isinstance(node, ast.Constant) and any(node.value is v for v in (None, True, False))


def _device_placements(tree: ast.Module) -> set[int]:
    """The ``.device`` reads that only place a new tensor: ``device=x.device`` of a function or method that makes
    one (:data:`PLACING`; not of ``dict``, ``.update`` or a helper, which would hand the device to host code),
    ``.to(x.device)``, and ``dev = x.device`` in a function that uses ``dev`` only in those places."""
    ok: set[int] = set()
    placed: set[int] = set()  # Name loads in a placing position
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if not (isinstance(call.func, ast.Attribute) and call.func.attr in PLACING):
            continue
        values = [kw.value for kw in call.keywords if kw.arg == "device"]
        if call.func.attr == "to" and call.args:
            values.append(call.args[0])
        ok.update(id(v) for v in values if isinstance(v, ast.Attribute) and v.attr == "device")
        placed.update(id(v) for v in values if isinstance(v, ast.Name))
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        names = [n for n in ast.walk(fn) if isinstance(n, ast.Name)]
        for a in (n for n in ast.walk(fn) if isinstance(n, ast.Assign)):
            if not (len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)
                    and isinstance(a.value, ast.Attribute) and a.value.attr == "device"):
                continue
            uses = [n for n in names if n.id == a.targets[0].id]
            stores = [n for n in uses if not isinstance(n.ctx, ast.Load)]
            if len(stores) == 1 and all(id(n) in placed for n in uses if isinstance(n.ctx, ast.Load)):
                ok.add(id(a.value))
    return ok


def _annotation_names(tree: ast.Module) -> set[int]:
    """The bare names inside annotations (``-> dict[str, torch.Tensor]``): types, never called there."""
    notes: list[ast.AST] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.arg) and n.annotation:
            notes.append(n.annotation)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns:
            notes.append(n.returns)
        elif isinstance(n, ast.AnnAssign):
            notes.append(n.annotation)
    return {id(sub) for note in notes for sub in ast.walk(note) if isinstance(sub, ast.Name)}


def epilogue_helpers(tree: ast.Module, aliases: dict[str, str]) -> set[str]:
    """Module-level functions an epilogue fn calls, directly or through each other: they run on the GPU's symbolic
    values too, so the epilogue body's rules hold for them."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def is_epilogue(fn: ast.FunctionDef) -> bool:
        targets = [d.func if isinstance(d, ast.Call) else d for d in fn.decorator_list]
        return any((isinstance(t, ast.Name) and aliases.get(t.id) == "epilogue")
                   or (isinstance(t, ast.Attribute) and t.attr == "epilogue") for t in targets)

    helpers: set[str] = set()
    todo = [fn for fn in functions.values() if is_epilogue(fn)]
    while todo:
        fn = todo.pop()
        for call in (n for stmt in fn.body for n in ast.walk(stmt) if isinstance(n, ast.Call)):
            name = call.func.id if isinstance(call.func, ast.Name) else None
            if name in functions and name not in helpers and not is_epilogue(functions[name]):
                helpers.add(name)
                todo.append(functions[name])
    return helpers


def _raise_messages(tree: ast.Module) -> set[int]:
    """Nodes inside a ``raise`` or an ``assert``'s message: evaluated only to stop, so formatting there tells nothing."""
    roots = [n.exc for n in ast.walk(tree) if isinstance(n, ast.Raise) and n.exc] + \
            [n.msg for n in ast.walk(tree) if isinstance(n, ast.Assert) and n.msg]
    return {id(sub) for root in roots for sub in ast.walk(root)}


def _attribute_names(tree: ast.Module) -> set[str]:
    """Names bound only by ``name = <expr>.<attr>`` (``dev = x.device``, ``dt = torch.float32``): never a
    parameter, a loop variable, an unpacking or any other value."""
    from_attribute = {id(n.targets[0]) for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
                      and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Attribute)}
    only: dict[str, bool] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            only[n.id] = only.get(n.id, True) and id(n) in from_attribute
        elif isinstance(n, ast.arg):
            only[n.arg] = False
    return {name for name, ok in only.items() if ok}


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module) -> None:
        self.violations: list[Violation] = []
        self.torch: set[str] = set()
        self.math: set[str] = set()
        self.prims: set[str] = set()  # names bound to the primitives module
        self.globals: set[str] = set()
        self.builtins = builtin_loads(tree)
        self.prim_aliases = primitive_aliases(tree)
        self.device_placements = _device_placements(tree)
        self.raise_messages = _raise_messages(tree)
        self.attribute_names = _attribute_names(tree)
        self.annotation_names = _annotation_names(tree)
        self.epilogue_helpers = epilogue_helpers(tree, self.prim_aliases)
        self.epilogue_depth = 0  # > 0 inside an epilogue fn's body
        self.params: list[set[str]] = []  # parameters of the enclosing functions
        self.scopes: list[set[str]] = []  # names the enclosing functions assign themselves
        self._call_funcs: set[int] = set()
        self._value_roots: set[int] = set()  # module Names used as module.<attr>
        self._schedule_names: set[int] = set()  # the one accepted use of primitives.schedule
        #: The accepted uses of primitives.epilogue: decorators of module-level functions.
        self._epilogue_decorators = {id(d.func if isinstance(d, ast.Call) else d) for n in tree.body
                                     if isinstance(n, ast.FunctionDef) for d in n.decorator_list}

    def flag(self, node: ast.AST, message: str) -> None:
        self.violations.append(Violation(getattr(node, "lineno", 0), message))

    # --- imports -------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            bound = alias.asname or alias.name
            if alias.name == "torch":
                self.torch.add(bound)
            elif alias.name == "math":
                self.math.add(bound)
            elif alias.name == PRIMITIVES and alias.asname:
                self.prims.add(alias.asname)
            else:
                self.flag(node, f"import of {alias.name!r} is not allowed (only coda_agent.primitives, math, torch)")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level:
            self.flag(node, "relative imports are not allowed")
        elif mod == "__future__":
            for a in node.names:
                if a.name not in FUTURE_IMPORTS:
                    self.flag(node, f"from __future__, only {', '.join(sorted(FUTURE_IMPORTS))} may be imported")
        elif mod == "coda_agent":
            for a in node.names:
                if a.name == "primitives":
                    self.prims.add(a.asname or a.name)
                else:
                    self.flag(node, "from coda_agent, only 'primitives' may be imported")
        elif mod == PRIMITIVES:
            for a in node.names:
                if a.name == "*":
                    self.flag(node, "star imports are not allowed; import the names you use")
                elif a.name not in primitives.__all__:
                    self.flag(node, f"{a.name!r} is not part of coda_agent.primitives (see the API reference)")
        elif mod == "math":
            for a in node.names:
                if a.name == "*" or a.name.startswith("_"):
                    self.flag(node, f"from math, {a.name!r} may not be imported")
        else:
            self.flag(node, f"import from {mod!r} is not allowed (only coda_agent.primitives, math, torch)")

    # --- definitions ---------------------------------------------------------------------------

    def _check_annotations(self, node: ast.FunctionDef) -> None:
        """Annotations name types; they run at import (without the future import), so nothing else may be in them."""
        a = node.args
        notes = [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x and x.annotation]
        for note in [*notes, *([node.returns] if node.returns else [])]:
            if not _names_a_type(note):
                self.flag(note, f"the annotation {ast.unparse(note)!r} must only name types (torch.Tensor, dict[str, int], float | None)")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._check_annotations(node)
        is_epilogue = False
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if self._is_primitive(target, "schedule"):
                self._check_schedule(node, dec)
            elif self._is_primitive(target, "epilogue"):
                is_epilogue = True
                if not isinstance(dec, ast.Call):
                    self.flag(dec, "write @epilogue() with parentheses (or @epilogue(outputs=..., ...)): bare @epilogue "
                                   "raises a TypeError at import")
            else:
                self.flag(dec, "the only decorators allowed are @epilogue(...), and @schedule({...}) on forward")
        is_epilogue = is_epilogue or (not self.params and node.name in self.epilogue_helpers)
        for default in (*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)):
            if not _is_constant(default):
                self.flag(default, "default values must be constants (None, numbers, strings, tuples): a mutable default keeps state across calls")
        a = node.args
        self.params.append({arg.arg for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if arg})
        self.scopes.append({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
        for part in _outer_parts(node):
            self.visit(part)
        self.epilogue_depth += is_epilogue
        for stmt in node.body:
            self.visit(stmt)
        self.epilogue_depth -= is_epilogue
        self.params.pop()
        self.scopes.pop()

    def _check_schedule(self, fn: ast.FunctionDef, dec: ast.expr) -> None:
        """``@schedule({...})`` only on the top-level forward, alone, in the literal form."""
        self._schedule_names.add(id(dec.func if isinstance(dec, ast.Call) else dec))
        if fn.name != "forward" or self.params or len(fn.decorator_list) != 1:
            self.flag(dec, "@schedule({...}) may only decorate the top-level forward, as its only decorator")
            return
        if not isinstance(dec, ast.Call):
            self.flag(dec, "schedule must be called with its table: @schedule({(epilogue_name, M, N, K): Config(...)})")
            return
        config_names = {f"{p}.Config" for p in self.prims} | {y for y, x in self.prim_aliases.items() if x == "Config"}
        try:
            literal_schedule(dec, config_names)
        except ScheduleFormError as exc:
            self.flag(dec, str(exc))

    def _banned(self, node: ast.AST, what: str) -> None:
        self.flag(node, f"{what} are not allowed in a candidate")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._banned(node, "class definitions")

    def visit_Global(self, node: ast.Global) -> None:
        self._banned(node, "global statements (state across calls)")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self._banned(node, "nonlocal statements (state across calls)")

    def visit_Try(self, node: ast.Try) -> None:
        self._banned(node, "try/except blocks (fallback paths)")

    def visit_TryStar(self, node: ast.TryStar) -> None:
        self._banned(node, "try/except blocks (fallback paths)")

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._banned(node, "async functions")

    def visit_Await(self, node: ast.Await) -> None:
        self._banned(node, "await expressions")

    def visit_Yield(self, node: ast.Yield) -> None:
        self._banned(node, "generators")

    def visit_YieldFrom(self, node: ast.YieldFrom) -> None:
        self._banned(node, "generators")

    def visit_With(self, node: ast.With) -> None:
        self._banned(node, "with blocks")

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        self._banned(node, "with blocks")

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self._banned(node, "async loops")

    def visit_Match(self, node: ast.AST) -> None:
        self._banned(node, "match statements")

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._banned(node, "assignment expressions (:=)")

    # --- stores --------------------------------------------------------------------------------

    def _check_target(self, target: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_target(t)
        elif isinstance(target, ast.Starred):
            self._check_target(target.value)
        elif isinstance(target, ast.Attribute):
            self.flag(target, f"assigning to an attribute ({ast.unparse(target)}) is not allowed: no state on objects, modules or tensors")
        elif isinstance(target, ast.Subscript):
            root = target.value
            while isinstance(root, (ast.Subscript, ast.Attribute)):
                root = root.value
            if isinstance(root, ast.Name):
                if self.params and root.id in self.params[-1]:
                    self.flag(target, f"writing into the input {root.id!r} is not allowed: inputs are read-only")
                elif self.params and root.id in self.globals and not self._local(root.id):
                    self.flag(target, f"writing into the module-level {root.id!r} is not allowed (state across calls)")

    def _local(self, name: str) -> bool:
        return bool(self.scopes) and name in self.scopes[-1]

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        if self.epilogue_depth and not isinstance(node.op, EPILOGUE_OPERATORS):
            self.flag(node, f"the operator {_OP_SYMBOLS.get(type(node.op), type(node.op).__name__)}= is not allowed inside an "
                            "epilogue fn: + - * / work alike on the emulator and the GPU (use the value functions for the rest)")
        if isinstance(node.op, ast.MatMult):
            self.flag(node, "the @= operator is not allowed: the GEMM must run through primitives.gemm")
        if isinstance(node.target, ast.Name) and self.params and node.target.id in self.params[-1]:
            self.flag(node, f"'{node.target.id} {ast.unparse(node.op)}= ...' updates an input in place; write 'y = {node.target.id} ...' instead")
        if isinstance(node.target, ast.Name) and self.params and node.target.id in self.globals and not self._local(node.target.id):
            self.flag(node, f"updating the module-level {node.target.id!r} is not allowed (state across calls)")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target)
        if not _names_a_type(node.annotation):
            self.flag(node, f"the annotation {ast.unparse(node.annotation)!r} must only name types")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    # --- expressions ---------------------------------------------------------------------------

    def _primitive_name(self, node: ast.AST) -> str | None:
        """The primitive ``node`` names (``gemm``, ``prims.gemm`` or an alias), or None."""
        if isinstance(node, ast.Name):
            return self.prim_aliases.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.prims:
            return node.attr if node.attr in primitives.__all__ else None
        return None

    def _is_primitive(self, node: ast.AST, name: str | None = None) -> bool:
        found = self._primitive_name(node)
        return found is not None and (name is None or found == name)

    def _epilogue_call(self, node: ast.Call) -> None:
        """Inside an epilogue fn: the primitives' value functions, math, float and int only."""
        func = node.func
        ok = (isinstance(func, ast.Name) and (self.prim_aliases.get(func.id) in EPILOGUE_FUNCTIONS
                                              or (func.id in EPILOGUE_BUILTINS and id(func) in self.builtins)
                                              or func.id in self.epilogue_helpers))
        on_numbers = all(_is_constant(a) or _number_expr(a, self.math) for a in (*node.args, *(k.value for k in node.keywords)))
        ok = ok or (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    and ((func.value.id in self.prims and func.attr in EPILOGUE_FUNCTIONS) or (func.value.id in self.math and on_numbers)))
        if not ok:
            self.flag(node, f"{ast.unparse(func)}() cannot be called inside an epilogue fn: its values are symbolic "
                            f"on the GPU; call the primitives' value functions ({', '.join(sorted(EPILOGUE_FUNCTIONS))}), "
                            "your own module-level functions that keep to the same rules, or math and float/int on "
                            "Python numbers")

    def visit_Call(self, node: ast.Call) -> None:
        self._call_funcs.add(id(node.func))
        func = node.func
        self._named_device(node)
        if self.epilogue_depth:
            self._epilogue_call(node)
        if isinstance(func, ast.Name) and id(func) in self.builtins and func.id not in BUILTINS and not self._message_str(func):
            self.flag(node, f"{func.id}() is not allowed in a candidate")
        elif isinstance(func, ast.Attribute) and not self._module_attr(func):
            if func.attr not in METHODS:
                self.flag(node, f".{func.attr}() is not allowed (host glue may call: see the contract's method list)")
            root = func.value
            if isinstance(root, ast.Name) and root.id in self.globals and self.params and not self._local(root.id) and func.attr not in ("get", "items", "keys", "values", "copy"):
                self.flag(node, f"calling .{func.attr}() on the module-level {root.id!r} is not allowed (state across calls)")
        self.generic_visit(node)

    def _named_device(self, node: ast.Call) -> None:
        """``device="cpu"``, ``.to("meta")``: a device named in the code tells the checker's meta and CPU runs apart
        from the GPU's; tensors go where the inputs are (``device=x.device``). A device (or ``.to``'s first
        argument) must be an attribute (``x.device``, ``torch.float32``) or a name bound only to one, and a call
        that makes a tensor takes no ``**`` arguments."""
        given = [kw.value for kw in node.keywords if kw.arg == "device"]
        placing = isinstance(node.func, (ast.Attribute, ast.Name)) and (
            node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in PLACING
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
            given += node.args[:1]
        if any(not (self._place_or_type(v) or (isinstance(v, ast.Name) and v.id in self.attribute_names))
               for v in given) or (placing and any(kw.arg is None for kw in node.keywords)):
            self.flag(node, "a device may not be named in the code: put new tensors where the inputs are "
                            "(device=x.device, .to(x.device), .to(torch.float32), .to(dtype=...)); hand a helper a "
                            "tensor, not a device")
        elif (isinstance(node.func, ast.Attribute) and node.func.attr == "Tensor" and isinstance(node.func.value, ast.Name)
              and node.func.value.id in self.torch):
            self.flag(node, "torch.Tensor names a type; make tensors with torch.zeros/empty/...(..., device=x.device)")
        elif (isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES and isinstance(node.func.value, ast.Name)
              and node.func.value.id in self.torch and not given):
            self.flag(node, f"torch.{node.func.attr}() must say where the tensor goes: device=x.device (the default, the "
                            "CPU, is not where the inputs are on the GPU)")

    def _place_or_type(self, node: ast.AST) -> bool:
        """``<expr>.device``, ``<expr>.dtype`` or ``torch.<dtype>``: what may say where a tensor goes or what it holds."""
        if not isinstance(node, ast.Attribute):
            return False
        if node.attr in ("device", "dtype"):
            return True
        return isinstance(node.value, ast.Name) and node.value.id in self.torch and node.attr in TORCH_DTYPES

    def _message_str(self, node: ast.Name) -> bool:
        """``str`` in a raise or assert message: it only builds the text of a stop."""
        return node.id == "str" and id(node) in self.raise_messages

    def _module_attr(self, node: ast.Attribute) -> bool:
        """``torch.f`` / ``math.f`` / ``P.f`` (checked in visit_Attribute); True when node is one."""
        return isinstance(node.value, ast.Name) and node.value.id in (self.torch | self.math | self.prims)

    def _stray_schedule(self, node: ast.Name | ast.Attribute) -> None:
        if self._is_primitive(node, "schedule") and id(node) not in self._schedule_names:
            self.flag(node, "schedule may only be used as the decorator @schedule({...}) of forward")
        if self._is_primitive(node, "epilogue") and id(node) not in self._epilogue_decorators:
            self.flag(node, "epilogue may only be used as the decorator @epilogue(...) of a module-level function")
        if self._is_primitive(node, "Epilogue"):
            self.flag(node, "Epilogue objects are made with the decorator @epilogue(...), not by hand")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._stray_schedule(node)
        in_module = isinstance(node.value, ast.Name) and node.value.id in self.prims | self.math
        if self.epilogue_depth and not in_module:
            self.flag(node, f"{ast.unparse(node)} cannot be read inside an epilogue fn: the same fn runs on the emulator's "
                            "tensors and on the GPU's symbolic values, and may not tell them apart")
        if node.attr == "device" and id(node) not in self.device_placements and not self._module_attr(node):
            self.flag(node, f"{ast.unparse(node)} may only place a new tensor (device={ast.unparse(node)}, "
                            f".to({ast.unparse(node)})): host code must not depend on where it runs")
        if node.attr.startswith("_"):
            self.flag(node, f"access to private attribute {node.attr!r} is not allowed")
        elif self._module_attr(node):
            assert isinstance(node.value, ast.Name)
            self._value_roots.add(id(node.value))
            mod = node.value.id
            if mod in self.torch and node.attr not in TORCH_FUNCTIONS | TORCH_VALUES:
                self.flag(node, f"torch.{node.attr} is not allowed in a candidate (the GEMM and all kernels go through primitives; host glue: see the contract's torch list)")
            elif mod in self.torch and node.attr in TORCH_FUNCTIONS and id(node) not in self._call_funcs:
                self.flag(node, f"torch.{node.attr} may only be called, not passed around")
            elif mod in self.prims and node.attr not in primitives.__all__:
                self.flag(node, f"primitives.{node.attr} does not exist (see the API reference)")
        elif id(node) not in self._call_funcs and node.attr not in DATA_ATTRS:
            self.flag(node, f"reading the attribute .{node.attr} is not allowed (a method must be called where it is named; data: {', '.join(sorted(DATA_ATTRS))})")
        if isinstance(node.value, ast.Attribute) and self._module_attr(node.value):
            self.flag(node, f"{ast.unparse(node)}: attribute chains beyond torch.<name> are not allowed")
        self.generic_visit(node)

    def visit(self, node: ast.AST) -> None:
        if self.epilogue_depth and type(node) in _EPILOGUE_BANNED:
            self.flag(node, f"{_EPILOGUE_BANNED[type(node)]} are not allowed inside an epilogue fn: the GPU traces it once "
                            "for every element, on symbolic values (use maximum/minimum for clamps and selects)")
        super().visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self.epilogue_depth and not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)):
            self.flag(node, f"{ast.unparse(node)}: inside an epilogue fn only a constant index (of a tuple such as "
                            "dswiglu's) is allowed; a value is one element, not a tile")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        sides = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, sides, sides[1:], strict=False):
            if isinstance(op, (ast.Is, ast.IsNot)) and not any(_is_singleton(side) or (
                    isinstance(side, ast.Attribute) and side.attr != "device" and self._place_or_type(side))
                    for side in (left, right)):
                self.flag(node, "is / is not may only compare with None, True, False or a dtype (object identity "
                                "tells tensors and devices apart that the checker's runs must not)")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if self.epilogue_depth and not isinstance(node.op, (ast.USub, ast.UAdd)) and not isinstance(node.operand, ast.Constant):
            self.flag(node, "only unary minus and plus are allowed on values inside an epilogue fn")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        constant = isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant)
        if self.epilogue_depth and not isinstance(node.op, EPILOGUE_OPERATORS) and not constant:
            self.flag(node, f"the operator {_OP_SYMBOLS.get(type(node.op), type(node.op).__name__)} is not allowed inside an "
                            "epilogue fn: + - * / work alike on the emulator and the GPU (use the value functions for the rest)")
        if isinstance(node.op, ast.MatMult):
            self.flag(node, "the @ operator is not allowed: the GEMM must run through primitives.gemm")
        if (isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)
                and id(node) not in self.raise_messages):
            self.flag(node, "%-formatting is allowed only in a raise or assert message (formatting a tensor reads its values)")
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if id(node) not in self.raise_messages and any(isinstance(v, ast.FormattedValue) for v in node.values):
            self.flag(node, "f-strings with values are allowed only in a raise or assert message (formatting a tensor reads its values)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self._stray_schedule(node)
        if node.id.startswith("__"):
            self.flag(node, f"{node.id} is not allowed")
        elif isinstance(node.ctx, ast.Load):
            if node.id in self.torch | self.math | self.prims and id(node) not in self._value_roots:
                self.flag(node, f"{node.id} may only be used as {node.id}.<name> (no aliases or passing the module around)")
            elif id(node) in self.builtins and node.id not in BUILTINS and not self._message_str(node) and not (
                    id(node) in self.annotation_names and node.id in ANNOTATION_BUILTINS):
                self.flag(node, f"the name {node.id!r} is not allowed in a candidate")
        self.generic_visit(node)


def _names_a_type(note: ast.AST) -> bool:
    """An annotation that only names types (``torch.Tensor``, ``dict[str, int]``, ``float | None``)."""
    return all(isinstance(n, _TYPE_NODES) or (isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr)) for n in ast.walk(note))


_NUMBER_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div)


def _number_expr(node: ast.AST, math_names: set[str]) -> bool:
    """A Python number the module computes once: numeric literals, ``math.pi``/``e``/``tau``, ``+ - * /`` and
    unary signs of such, and ``math.f(...)`` of such (``math.sqrt(2.0 / math.pi)``): a float constant wherever
    it stands (never a value)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and _number_expr(node.operand, math_names)
    if isinstance(node, ast.BinOp):
        return (isinstance(node.op, _NUMBER_OPERATORS) and _number_expr(node.left, math_names)
                and _number_expr(node.right, math_names))
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id in math_names and node.attr in ("pi", "e", "tau")
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id in math_names and not node.keywords and bool(node.args)
                and all(_number_expr(a, math_names) for a in node.args))
    return False


def _is_constant(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple):
        return all(_is_constant(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _is_constant(node.operand)
    return False


def check_source(source: str) -> list[Violation]:
    """All violations of the candidate contract in ``source`` (empty when it may run); never raises on any text."""
    try:
        tree = parse_module(source)
    except UnreadableModule as exc:
        return [Violation(exc.lineno or 0, exc.msg)]
    except SyntaxError as exc:
        return [Violation(exc.lineno or 0, f"syntax error: {exc.msg}")]
    try:
        return _check_tree(tree)
    except (RecursionError, MemoryError):  # parse_module bounds the depth; this is the last line behind it
        return [Violation(0, "expression nested too deeply for the static check: split it into named parts")]


def _check_tree(tree: ast.Module) -> list[Violation]:
    checker = _Checker(tree)
    math_names = {a.asname or a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names if a.name == "math"}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    checker.globals.add(t.id)
                else:
                    checker.flag(node, "top-level assignments must bind plain names")
            value = node.value
            if value is not None:
                numbers = {id(sub) for n in ast.walk(value) if isinstance(n, ast.Call) and _number_expr(n, math_names)
                           for sub in ast.walk(n)}  # math.sqrt(2 / math.pi): a float constant
                bad = [n for n in ast.walk(value) if not isinstance(n, _CONST_NODES)]
                calls = [n for n in ast.walk(value) if isinstance(n, ast.Call) and id(n) not in numbers
                         and checker._primitive_name(n.func) not in DECLARATIONS]
                if bad or calls:
                    checker.flag(node, "top-level assignments must be constants (literals, tuples, dicts, math on numbers such as math.sqrt(2 / math.pi), declarations such as Config(...) or RowVecLoad()): no tensors, values or other state")
        elif isinstance(node, ast.Expr) and not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            checker.flag(node, "top-level expressions other than the docstring are not allowed")
        elif not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Assign, ast.AnnAssign, ast.Expr)):
            checker.flag(node, f"top-level {type(node).__name__} statements are not allowed (imports, functions and constants only)")
    # Imports first (module names), then call sites (so attributes know whether they are called), then the rest.
    for sub in ast.walk(tree):
        if isinstance(sub, (ast.Import, ast.ImportFrom)):
            checker.visit(sub)
    for sub in ast.walk(tree):
        if isinstance(sub, ast.Call):
            checker._call_funcs.add(id(sub.func))
        if isinstance(sub, ast.Attribute) and checker._module_attr(sub):
            assert isinstance(sub.value, ast.Name)
            checker._value_roots.add(id(sub.value))
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            checker.visit(node)
    protected = (set(checker.prim_aliases) | checker.torch | checker.math | checker.prims
                 | {n.name for n in tree.body if isinstance(n, ast.FunctionDef)})
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] + [
        (a.asname or a.name).split(".")[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names]
    defined = [d for d in defined if d in protected]
    for name in {d for d in defined if defined.count(d) > 1}:
        checker.flag(tree, f"{name!r} is defined or imported twice: each function and primitive has one meaning")
    for site, name in rebindings(tree, protected):
        checker.flag(site, f"{name!r} names an import or one of the module's functions: it may not be rebound")
    has_forward = any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in tree.body)
    if not has_forward:
        checker.violations.append(Violation(0, "the module must define a top-level function forward(**inputs)"))
    return sorted(set(checker.violations), key=lambda v: (v.line, v.message))
