"""What every rule knows while the walk runs: the facts read once from the whole module, where the walk
stands, and the violations found so far."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from ... import primitives
from .contract import EPILOGUE_OPERATORS, PLACING, PRIMITIVES, TORCH_DTYPES, TYPE_NODES
from .scopes import builtin_loads, primitive_aliases


@dataclass(frozen=True)
class Violation:
    """``allowlist``: a host name the allowlist lacks (the feedback then lists the allowlist in full)."""

    line: int
    message: str
    allowlist: bool = False

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class Check:
    """One module's check. The facts are fixed before the walk; ``params``, ``scopes`` and ``epilogue_depth``
    follow the walk into functions."""

    tree: ast.Module
    torch: set[str]  # names bound to torch
    math: set[str]  # names bound to math
    prims: set[str]  # names bound to the primitives module
    globals: set[str]  # names the module binds at top level by assignment
    builtins: set[int]  # Name loads no binding resolves (:func:`~.scopes.builtin_loads`)
    prim_aliases: dict[str, str]
    device_placements: set[int]
    raise_messages: set[int]
    attribute_names: set[str]
    annotation_names: set[int]
    epilogue_helpers: set[str]
    call_funcs: set[int]  # the ``func`` of every call
    value_roots: set[int]  # module Names used as module.<attr>
    schedule_decorators: set[int]  # the one accepted use of primitives.schedule
    epilogue_decorators: set[int]  # the accepted uses of primitives.epilogue: decorators of functions
    violations: list[Violation] = field(default_factory=list)
    params: list[set[str]] = field(default_factory=list)  # parameters of the enclosing functions
    scopes: list[set[str]] = field(default_factory=list)  # names the enclosing functions assign themselves
    epilogue_depth: int = 0  # > 0 inside an epilogue fn's body

    @classmethod
    def of(cls, tree: ast.Module) -> Check:
        torch, math, prims = module_names(tree)
        aliases = primitive_aliases(tree)
        check = cls(
            tree=tree, torch=torch, math=math, prims=prims, globals=top_level_names(tree),
            builtins=builtin_loads(tree), prim_aliases=aliases, device_placements=device_placements(tree),
            raise_messages=raise_messages(tree), attribute_names=attribute_names(tree),
            annotation_names=annotation_names(tree), epilogue_helpers=epilogue_helpers(tree, aliases),
            call_funcs={id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}, value_roots=set(),
            schedule_decorators=set(),
            epilogue_decorators={id(d.func if isinstance(d, ast.Call) else d) for n in tree.body
                                 if isinstance(n, ast.FunctionDef) for d in n.decorator_list},
        )
        check.value_roots = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                             and check.module_attr(n)}
        check.schedule_decorators = {id(d.func if isinstance(d, ast.Call) else d) for n in ast.walk(tree)
                                     if isinstance(n, ast.FunctionDef) for d in n.decorator_list
                                     if check.is_primitive(d.func if isinstance(d, ast.Call) else d,
                                                           "schedule")}
        return check

    def flag(self, node: ast.AST, message: str, allowlist: bool = False) -> None:
        self.violations.append(Violation(getattr(node, "lineno", 0), message, allowlist))

    @property
    def in_function(self) -> bool:
        return bool(self.params)

    def is_input(self, name: str) -> bool:
        """A parameter of the innermost enclosing function."""
        return bool(self.params) and name in self.params[-1]

    def is_module_state(self, name: str) -> bool:
        """Inside a function, a module-level name the function does not assign itself."""
        return bool(self.params) and name in self.globals and not self.local(name)

    def local(self, name: str) -> bool:
        return bool(self.scopes) and name in self.scopes[-1]

    def primitive_name(self, node: ast.AST) -> str | None:
        """The primitive ``node`` names (``gemm``, ``prims.gemm`` or an alias), or None."""
        if isinstance(node, ast.Name):
            return self.prim_aliases.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value,
                                                          ast.Name) and node.value.id in self.prims:
            return node.attr if node.attr in primitives.__all__ else None
        return None

    def is_primitive(self, node: ast.AST, name: str | None = None) -> bool:
        found = self.primitive_name(node)
        return found is not None and (name is None or found == name)

    def module_attr(self, node: ast.Attribute) -> bool:
        """``torch.f`` / ``math.f`` / ``P.f``: True when node is one."""
        return isinstance(node.value, ast.Name) and node.value.id in (self.torch | self.math | self.prims)

    def place_or_type(self, node: ast.AST) -> bool:
        """``<expr>.device``, ``<expr>.dtype`` or ``torch.<dtype>``: what may say where a tensor goes or what
        it holds."""
        if not isinstance(node, ast.Attribute):
            return False
        if node.attr in ("device", "dtype"):
            return True
        return isinstance(node.value, ast.Name) and node.value.id in self.torch and node.attr in TORCH_DTYPES

    def message_str(self, node: ast.Name) -> bool:
        """``str`` in a raise or assert message: it only builds the text of a stop."""
        return node.id == "str" and id(node) in self.raise_messages


# --- facts read from the whole module ------------------------------------------------------------


def module_names(tree: ast.Module) -> tuple[set[str], set[str], set[str]]:
    """The names any import of the module binds to torch, to math and to the primitives module."""
    torch: set[str] = set()
    math: set[str] = set()
    prims: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name
                if alias.name == "torch":
                    torch.add(bound)
                elif alias.name == "math":
                    math.add(bound)
                elif alias.name == PRIMITIVES and alias.asname:
                    prims.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module == "coda_agent":
            prims.update(a.asname or a.name for a in node.names if a.name == "primitives")
    return torch, math, prims


def top_level_names(tree: ast.Module) -> set[str]:
    """The plain names the module's top-level assignments bind."""
    return {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node,
                                                 ast.Assign) else [node.target]) if isinstance(t, ast.Name)}


def device_placements(tree: ast.Module) -> set[int]:
    """The ``.device`` reads that only place a new tensor: ``device=x.device`` of a function or method that
    makes one (:data:`PLACING`; not of ``dict``, ``.update`` or a helper, which would hand the device to host
    code), ``.to(x.device)``, and ``dev = x.device`` in a function that uses ``dev`` only in those places."""
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


def annotation_names(tree: ast.Module) -> set[int]:
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
    """Module-level functions an epilogue fn calls, directly or through each other: they run on the GPU's
    symbolic values too, so the epilogue body's rules hold for them."""
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


def raise_messages(tree: ast.Module) -> set[int]:
    """Nodes inside a ``raise`` or an ``assert``'s message: evaluated only to stop, so formatting there tells
    nothing."""
    roots = ([n.exc for n in ast.walk(tree) if isinstance(n, ast.Raise) and n.exc]
             + [n.msg for n in ast.walk(tree) if isinstance(n, ast.Assert) and n.msg])
    return {id(sub) for root in roots for sub in ast.walk(root)}


def attribute_names(tree: ast.Module) -> set[str]:
    """Names bound only by ``name = <expr>.<attr>`` (``dev = x.device``, ``dt = torch.float32``): never a
    parameter, a loop variable, an unpacking or any other value."""
    from_attribute = {id(n.targets[0]) for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets)
                      == 1
                      and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Attribute)}
    only: dict[str, bool] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            only[n.id] = only.get(n.id, True) and id(n) in from_attribute
        elif isinstance(n, ast.arg):
            only[n.arg] = False
    return {name for name, ok in only.items() if ok}


def is_singleton(node: ast.AST) -> bool:
    """``None``, ``True`` or ``False`` written out (not ``0``, which equals False)."""
    return isinstance(node, ast.Constant) and any(node.value is v for v in (None, True, False))


def names_a_type(note: ast.AST) -> bool:
    """An annotation that only names types (``torch.Tensor``, ``dict[str, int]``, ``float | None``)."""
    return all(isinstance(n, TYPE_NODES)
               or (isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr)) for n in ast.walk(note))


def number_expr(node: ast.AST, math_names: set[str]) -> bool:
    """A Python number the module computes once: numeric literals, ``math.pi``/``e``/``tau``, ``+ - * /`` and
    unary signs of such, and ``math.f(...)`` of such (``math.sqrt(2.0 / math.pi)``): a float constant wherever
    it stands (never a value)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd)) and number_expr(node.operand, math_names)
    if isinstance(node, ast.BinOp):
        return (isinstance(node.op, EPILOGUE_OPERATORS) and number_expr(node.left, math_names)
                and number_expr(node.right, math_names))
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id in math_names and node.attr in ("pi", "e",
                                                                                                  "tau")
    if isinstance(node, ast.Call):
        return (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id in math_names and not node.keywords and bool(node.args)
                and all(number_expr(a, math_names) for a in node.args))
    return False


def is_constant(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple):
        return all(is_constant(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return is_constant(node.operand)
    return False
