"""No package of coda_agent imports a package above it (docs/architecture.md states the layers)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "coda_agent"
#: The layers, lowest first; the packages of one layer do not import each other.
LAYER_GROUPS = [("atomic", "settings", "provenance", "processes", "messages", "untrusted", "stdout",
                 "primitives"), ("tasks",), ("measure", "torch"),
                ("runner",), ("verifier",), ("execute",), ("bench",), ("store",), ("providers",),
                ("prompts",), ("agent",), ("viewer",), ("cli",), ("launch",), ("__main__",)]
LAYERS = [pkg for group in LAYER_GROUPS for pkg in group]
#: Data shipped inside the package (tasks, human kernels, mock scripts): candidates' code, not layers.
DATA = {"suite", "examples"}


def _rank(pkg: str) -> int:
    return next(i for i, group in enumerate(LAYER_GROUPS) if pkg in group)


def imports_of(path: Path) -> set[str]:
    """The coda_agent top-level packages a module imports (absolute or relative)."""
    rel = path.relative_to(PACKAGE).parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.startswith("coda_agent."):
                out.add(node.module.split(".")[1])
            elif node.level:
                base = list(rel[:-1])[: len(rel) - node.level] if node.level > 1 else list(rel[:-1])
                parts = base + [m for m in (node.module or "").split(".") if m]
                if parts:
                    out.add(parts[0].removesuffix(".py"))
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("coda_agent.")}
    return out


def test_every_package_is_in_a_layer():
    found = {
        p.name.removesuffix(".py") for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert found - {"__init__"} - DATA <= set(LAYERS), sorted(found - set(LAYERS) - {"__init__"} - DATA)


def test_no_package_imports_a_package_above_it():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        pkg = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if pkg == "__init__" or pkg in DATA:
            continue
        for target in imports_of(path) - {pkg}:
            if target in LAYERS and _rank(target) >= _rank(pkg):
                wrong.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert not wrong, wrong


def test_the_runner_stays_clear_of_the_checker():
    """The only process with candidate code loads the primitives, the timing clock and its own package: no
    task, reference, tolerance, stage, verdict or store (coda_agent/runner/__init__.py states it). Checked in
    a fresh interpreter, so what any module imports on the way counts too."""
    code = ("import sys, coda_agent.runner.serve; "
            "print(*sorted(m for m in sys.modules if m.startswith('coda_agent')), sep='\\n')")
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True).stdout.split())
    packages = ("coda_agent.runner", "coda_agent.primitives")  # whole
    modules = {"coda_agent", "coda_agent.measure", "coda_agent.measure.timing"}  # these alone
    outside = sorted(
        m for m in loaded - modules if not any(m == p or m.startswith(f"{p}.") for p in packages))
    assert "coda_agent.runner.serve" in loaded and not outside, outside


def test_the_runner_package_imports_nothing_of_the_layers_above_it():
    for path in sorted((PACKAGE / "runner").rglob("*.py")):
        assert imports_of(path) <= {"runner", "primitives", "measure"}, (path.name, imports_of(path))


def test_providers_reach_the_store_only_to_replay_a_run():
    """A provider speaks ``messages``; only ``replay`` reads the store, and only through the run-directory
    reader."""
    providers = PACKAGE / "providers"
    reaching = {p.name for p in providers.rglob("*.py") if "store" in imports_of(p)}
    assert reaching == {"replay.py"}, sorted(reaching)
    stored = {n.module for n in ast.walk(ast.parse((providers / "replay.py").read_text()))
              if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("store")}
    assert stored == {"store.rundir"}, stored


PRIMITIVES = PACKAGE / "primitives"


def _runs_at_import(node: ast.AST, lazy: bool) -> list[ast.AST]:
    """The statements under ``node`` that run when its module is imported (with ``lazy``, function bodies
    too); ``if TYPE_CHECKING:`` blocks never run."""
    found: list[ast.AST] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and not lazy:
            continue
        if isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING":
            found.extend(s for s in child.orelse for s in [s, *_runs_at_import(s, lazy)])
            continue
        found.append(child)
        found.extend(_runs_at_import(child, lazy))
    return found


def primitives_imports(path: Path, lazy: bool = False) -> set[str]:
    """The modules of coda_agent.primitives that one of its modules imports (``__init__`` for the package
    itself)."""
    modules = {p.stem for p in PRIMITIVES.glob("*.py")}

    def module_of(parts: list[str]) -> str:
        return parts[0] if parts and parts[0] in modules else "__init__"

    out = set()
    for node in _runs_at_import(ast.parse(path.read_text()), lazy):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                named = [m for m in (node.module or "").split(".") if m]
            elif node.level == 0 and (node.module or "").startswith("coda_agent.primitives"):
                named = node.module.split(".")[2:]
            else:
                continue
            out |= {module_of(named)} if named else {module_of([a.name]) for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {
                module_of(a.name.split(".")[2:]) for a in node.names
                if a.name.startswith("coda_agent.primitives")}
    return out - {path.stem}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (module -> the modules it imports), or [] if it has none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return []
        for target in sorted(graph.get(module, ())):
            found = visit(target, [*path, module])
            if found:
                return found
        done.add(module)
        return []

    return next((c for c in (visit(m, []) for m in sorted(graph)) if c), [])


def test_the_primitives_import_each_other_without_a_circle():
    """Each module of the primitives sits on the ones below it (the layer map in primitives/__init__.py): none
    imports, at import time or lazily inside a function, a module that imports it back."""
    for lazy in (False, True):
        graph = {p.stem: primitives_imports(p, lazy) for p in PRIMITIVES.glob("*.py")}
        assert not _cycle(graph), (lazy, _cycle(graph))
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_imports_after_its_first_definition():
    """Imports at the top, in every module of the package: one at the bottom of a module is how a circle hides
    (it runs after the importer has half loaded)."""
    late = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in DATA:
            continue
        body = ast.parse(path.read_text()).body
        first = next(
            (i for i, s in enumerate(body)
             if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))), len(body))
        after = _runs_at_import(ast.Module(body=body[first:], type_ignores=[]), lazy=False)
        imports = [n for n in after if isinstance(n, (ast.Import, ast.ImportFrom))]
        late += [f"{path.relative_to(PACKAGE)}:{n.lineno}" for n in imports]
    assert not late, late
