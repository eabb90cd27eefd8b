"""The worked-example library: other tasks' hand-written kernels (the suite's, and those of the places the
user names), loaded from disk and chosen for a target.

An example must never give the target's answer away (its own kernel, the same text, or a block task
that embeds the same epilogue); among the rest, the ones chosen cover what the target's kernel has to
do (:func:`task_needs`) before they match its wording.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..tasks.loader import BUILTIN_TASK_DIR, TaskError, load_task, task_files
from ..tasks.model import Task
from ..verifier import static
from ..verifier.static.schedule_source import unpinned


@dataclass(frozen=True)
class Example:
    """A hand-written kernel of another task, shown to the model as a worked example."""

    name: str
    family: str
    description: str
    reference_name: str
    reference_source: str
    kernel_source: str
    needs: frozenset[str] = frozenset()

    @property
    def primitives(self) -> frozenset[str]:
        """The primitive names the kernel imports (what the example teaches)."""
        try:
            tree = ast.parse(self.kernel_source)
        except SyntaxError:
            return frozenset()
        return frozenset(
            a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
            == static.PRIMITIVES for a in n.names
        )

    @property
    def size(self) -> int:
        return len(self.reference_source) + len(self.kernel_source) + len(self.description)


def _normalised(source: str) -> str:
    return re.sub(r"\s+", " ", source).strip()


def _call_shape(node: ast.expr) -> str:
    """``ColVecReduce(scaled=True)`` -> ``ColVecReduce(scaled=True)``; operand names (``index=``) left out."""
    if not isinstance(node, ast.Call):
        return ast.dump(node)
    name = node.func.id if isinstance(node.func, ast.Name) else ast.dump(node.func)
    kwargs = sorted(f"{k.arg}={ast.dump(k.value)}" for k in node.keywords if k.arg != "index")
    return f"{name}({', '.join(kwargs)})"


def epilogue_signatures(source: str) -> set[str]:
    """A structural fingerprint of each ``@epilogue`` in a kernel: mode, extra outputs, pins, sinks, C.

    Names and arithmetic are left out on purpose: two kernels with the same fingerprint solve the same
    fused problem, which is how a block task that embeds the target's kernel is recognised.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func,
                                                             ast.Name) and dec.func.id == "epilogue"):
                continue
            kw = {k.arg: k.value for k in dec.keywords}
            outputs = dec.args[0] if dec.args else kw.get("outputs")
            n_outputs = len(outputs.elts) if isinstance(outputs, (ast.Tuple, ast.List)) else 0
            mode = kw.get("mode")
            pins = kw.get("operands")
            sinks = kw.get("reduces")
            pin_shapes = sorted(_call_shape(v) for v in pins.values
                                if v is not None) if isinstance(pins, ast.Dict) else []
            sink_shapes = sorted(_call_shape(v) for v in sinks.values
                                 if v is not None) if isinstance(sinks, ast.Dict) else []
            has_c = any(a.arg == "c" for a in fn.args.args)
            found.add(
                f"mode={ast.literal_eval(mode) if isinstance(mode, ast.Constant) else 'element'} "
                f"outputs={n_outputs} pins={pin_shapes} sinks={sink_shapes} c={has_c}"
            )
    return found


def _role(symbol: str | int, m: str, n: str, k: str) -> str:
    """A dimension's role in the task's first GEMM: M, N, K, N/2 (one of a packed pair's halves) or other."""
    sym = str(symbol).replace(" ", "")
    roles = {m: "M", n: "N", k: "K"}
    if sym in roles:
        return roles[sym]
    return "N/2" if f"2*{sym}" == n else "other"


def task_needs(task: Task) -> frozenset[str]:
    """What a kernel for ``task`` has to do, from its tensors' shapes against its first GEMM: row or column
    statistics (a reduce sink), vector and full-tile operands, packed pairs (``acc_pair`` mode), extra
    outputs, integer indices, several GEMMs. Worked examples are picked to cover these, not only by
    wording."""
    if not task.gemms:
        return frozenset({f"family:{task.family}"})
    m, n, k = (str(d).replace(" ", "") for d in task.gemms[0])
    needs = {f"family:{task.family}"}
    if len(task.gemms) > 1:
        needs.add("gemms:several")
    full_outputs = 0
    for kind, specs in (("in", task.inputs), ("out", task.outputs)):
        for spec in specs:
            roles = ",".join(_role(d, m, n, k) for d in spec.shape)
            if kind == "in" and roles in ("M,K", "N,K"):
                continue  # the GEMM's own operands: every task has them
            integer = spec.dtype.startswith(("int", "uint"))
            needs.add(f"{kind}:{roles}" + (":int" if integer else ""))
            full_outputs += kind == "out" and roles in ("M,N", "M,N/2")
    if full_outputs > 1:
        needs.add("out:several-tiles")
    return frozenset(needs)


def library_examples(task: Task, places: Sequence[str | Path] = ()) -> list[Example]:
    """Every other task with a human kernel in the library, never the target's own solution.

    The library is the built-in suite, then the task files and folders the user names in ``places``
    (``run --examples-from``); a kernel that merely sits in the target's folder is not in it, so one task of a
    user's folder never shows up in another's prompt unasked. Refused: the target itself, the same kernel file
    or text, and any kernel containing an epilogue with the same structure as one of the target's (a block
    task embedding the target's kernel gives the answer away). Task files that fail to load are skipped:
    examples are help, not a reason to stop a run; a place that does not exist is a :class:`TaskError`. A name
    seen once is not taken again.
    """
    folders = list(dict.fromkeys([BUILTIN_TASK_DIR.resolve(), *(Path(p).resolve() for p in places)]))
    own_file = task.human_file.resolve() if task.human_file else None
    own_source = task.human_file.read_text() if task.human_file and task.human_file.exists() else None
    own_text = _normalised(own_source) if own_source is not None else None
    own_epilogues = epilogue_signatures(own_source) if own_source is not None else set()
    found: list[Example] = []
    for path in task_files(folders):
        try:
            other = load_task(path)
        except TaskError:
            continue
        human = other.human_file
        if (
            other.name == task.name
            or other.name in {e.name for e in found}
            or human is None
            or not human.exists()
            or not other.reference_file.exists()
        ):
            continue
        kernel = unpinned(human.read_text())
        if (
            human.resolve() == own_file
            or _normalised(kernel) == own_text
            or own_epilogues & epilogue_signatures(kernel)
        ):
            continue
        found.append(
            Example(
                name=other.name, family=other.family, description=" ".join(other.description.split()),
                reference_name=other.reference, reference_source=other.reference_file.read_text().strip(),
                kernel_source=kernel.strip(), needs=task_needs(other),
            )
        )
    return found


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z][a-z0-9]+", text.lower()))


def select_examples(
    task: Task, *, places: Sequence[str | Path] = (), names: Sequence[str] | None = None, limit: int = 2,
    max_chars: int = 12000
) -> list[Example]:
    """Up to ``limit`` worked examples (two keep the first prompt lean; the API reference states the rules):
    the other tasks that best cover what the target needs (:func:`task_needs`) not yet covered by the examples
    chosen so far, then word overlap of description, conventions and reference code, then primitives not yet
    shown. ``names`` picks examples explicitly (the target itself is still refused).
    """
    pool = library_examples(task, places)
    if names is not None:
        by_name = {e.name: e for e in pool}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise TaskError(
                f"no usable example task(s) {missing} for {task.name} (available: "
                f"{', '.join(sorted(by_name)) or 'none'})"
            )
        return [by_name[n] for n in names]
    target = _words(task.description + " " + task.conventions + " " + task.reference_file.read_text())
    needs = task_needs(task)

    def similarity(e: Example) -> float:
        words = _words(e.description + " " + e.reference_source)
        return len(target & words) / max(1, len(target | words))

    chosen: list[Example] = []
    shown: set[str] = set()
    covered: set[str] = set()
    remaining = sorted(pool, key=lambda e: e.name)
    while remaining and len(chosen) < limit:
        best = max(remaining, key=lambda e: (
            len((needs - covered) & e.needs) / max(1, len(needs)) + similarity(e) + 0.03
            * len(e.primitives - shown),
            -len(e.name),
        ))
        remaining.remove(best)
        if chosen and sum(e.size for e in chosen) + best.size > max_chars:
            continue
        chosen.append(best)
        shown |= best.primitives
        covered |= best.needs & needs
    return chosen
