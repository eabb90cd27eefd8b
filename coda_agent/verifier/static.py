"""The static check: an AST allowlist for candidate modules.

A candidate may import only ``coda_agent.primitives`` (its public names), ``math`` and ``torch`` (for
light host glue on small tensors), and must define ``forward``. Everything that could reach around the
harness is refused by construction: other imports, dynamic code, I/O, threads, CUDA streams/graphs,
classes (tensor subclasses), global state, and any torch matmul that would replace the fused GEMM.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .. import primitives

ALLOWED_MODULES = {"math", "torch"}
PRIMITIVES = "coda_agent.primitives"
BANNED_CALLS = {
    "exec", "eval", "compile", "open", "__import__", "globals", "locals", "vars", "getattr", "setattr",
    "delattr", "input", "breakpoint", "memoryview", "help", "exit", "quit",
}
#: torch attributes that would replace the fused GEMM or escape the harness (streams, graphs, I/O, ...).
BANNED_TORCH_ATTRS = {
    "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "einsum", "tensordot", "linear", "bilinear",
    "chain_matmul", "mv", "addmv", "dot", "vdot", "inner", "outer", "ger", "conv1d", "conv2d", "kron",
    "cuda", "Stream", "Event", "stream", "compile", "jit", "ops", "library", "utils", "backends",
    "distributed", "multiprocessing", "hub", "save", "load", "from_file", "autograd", "profiler",
    "set_default_dtype", "set_default_device", "manual_seed", "random", "cpu", "mps", "xpu", "fx",
    "export", "func", "nn", "overrides", "classes", "storage", "UntypedStorage", "set_grad_enabled",
    "use_deterministic_algorithms", "set_float32_matmul_precision", "linalg", "sparse", "nested", "functional",
    "special", "fft", "masked",
}
BANNED_METHODS = {"matmul", "mm", "bmm", "addmm", "mv", "dot", "record_stream", "share_memory_", "data_ptr", "untyped_storage", "numpy", "tolist"}


@dataclass(frozen=True)
class Violation:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.torch_names: set[str] = set()
        self.torch_attr_roots: set[int] = set()  # torch Names used as `torch.<attr>` (the only allowed use)

    def flag(self, node: ast.AST, message: str) -> None:
        self.violations.append(Violation(getattr(node, "lineno", 0), message))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in ALLOWED_MODULES:
                if alias.name == "torch":
                    self.torch_names.add(alias.asname or "torch")
            elif alias.name != PRIMITIVES:
                self.flag(node, f"import of {alias.name!r} is not allowed (only coda_agent.primitives, math, torch)")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level:
            self.flag(node, "relative imports are not allowed")
        elif mod == "coda_agent":
            if any(a.name != "primitives" for a in node.names):
                self.flag(node, "from coda_agent, only 'primitives' may be imported")
        elif mod == PRIMITIVES:
            for a in node.names:
                if a.name == "*":
                    self.flag(node, "star imports are not allowed; import the names you use")
                elif a.name not in primitives.__all__:
                    self.flag(node, f"{a.name!r} is not part of coda_agent.primitives (see the API reference)")
        elif mod == "math":
            pass
        else:
            self.flag(node, f"import from {mod!r} is not allowed (only coda_agent.primitives, math, torch)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in BANNED_CALLS:
            self.flag(node, f"{node.func.id}() is not allowed in a candidate")
        if isinstance(node.func, ast.Attribute) and node.func.attr in BANNED_METHODS:
            self.flag(node, f".{node.func.attr}() is not allowed: the GEMM must run through primitives.gemm")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.torch_names:
            self.torch_attr_roots.add(id(node.value))
        if node.attr.startswith("_"):
            self.flag(node, f"access to private attribute {node.attr!r} is not allowed")
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value  # type: ignore[assignment]
        if (
            isinstance(root, ast.Name)
            and root.id in self.torch_names
            and isinstance(node.value, ast.Name)
            and node.attr in BANNED_TORCH_ATTRS
        ):
            self.flag(node, f"torch.{node.attr} is not allowed in a candidate (the GEMM and all kernels go through primitives)")
        if (
            isinstance(node.value, ast.Name)
            and node.value.id in {"P", "primitives"}
            and not node.attr.startswith("_")
            and node.attr not in primitives.__all__
        ):
            self.flag(node, f"primitives.{node.attr} does not exist (see the API reference)")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.flag(node, "the @ operator is not allowed: the GEMM must run through primitives.gemm")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.torch_names and id(node) not in self.torch_attr_roots:
            self.flag(node, f"{node.id} may only be used as {node.id}.<name> (no aliases or passing the module around)")
        if node.id.startswith("__") and node.id not in {"__name__", "__doc__"}:
            self.flag(node, f"{node.id} is not allowed")
        self.generic_visit(node)

    def _banned_stmt(self, node: ast.AST, what: str) -> None:
        self.flag(node, f"{what} are not allowed in a candidate")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._banned_stmt(node, "class definitions")

    def visit_Global(self, node: ast.Global) -> None:
        self._banned_stmt(node, "global statements (state across calls)")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self._banned_stmt(node, "nonlocal statements (state across calls)")

    def visit_Try(self, node: ast.Try) -> None:
        self._banned_stmt(node, "try/except blocks (fallback paths)")

    def visit_TryStar(self, node: ast.TryStar) -> None:
        self._banned_stmt(node, "try/except blocks (fallback paths)")

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._banned_stmt(node, "async functions")

    def visit_Yield(self, node: ast.Yield) -> None:
        self._banned_stmt(node, "generators")

    def visit_With(self, node: ast.With) -> None:
        self._banned_stmt(node, "with blocks")


def check_source(source: str) -> list[Violation]:
    """All violations of the candidate contract in ``source`` (empty when it may run)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [Violation(exc.lineno or 0, f"syntax error: {exc.msg}")]
    checker = _Checker()
    checker.visit(tree)
    has_forward = any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in tree.body)
    if not has_forward:
        checker.violations.append(Violation(0, "the module must define a top-level function forward(**inputs)"))
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Assign, ast.AnnAssign, ast.Expr)):
            checker.flag(node, f"top-level {type(node).__name__} statements are not allowed (imports, functions and constants only)")
    return sorted(checker.violations, key=lambda v: v.line)
