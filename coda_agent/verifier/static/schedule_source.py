"""The ``@schedule({...})`` on forward in a module's source: read, written (pinned) by the tuner, its notes
kept over a re-tune, and taken out when two candidates are compared. A pinned module passes the static check
before it is returned. The form itself is :mod:`.schedule_form`'s.

The tune stage and the prompt's feedback read it here (this module imports no torch).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Sequence

from ...primitives import Config
from ...primitives._schedule import ScheduleKey
from ...primitives.configs import Schedule, config_label, config_literal
from .contract import PRIMITIVES
from .parse import parse_module
from .rules import check_source
from .schedule_form import ScheduleFormError, literal_schedule
from .scopes import scope_bindings

#: The first line of the comment :func:`pin_schedule` writes above the decorator (and replaces on a re-tune).
NOTE_MARK = "# coda-agent tune:"


def without_schedule(source: str) -> str:
    """The module with forward's ``@schedule`` (and the names it imports for it) taken out, as normalised
    source: what two candidates that differ only in their pinned schedule have in common."""
    try:
        tree = parse_module(source)
    except SyntaxError:
        return source
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "forward":
            node.decorator_list = [
                d
                for d in node.decorator_list
                if not (isinstance(d, ast.Call) and ast.unparse(d.func).split(".")[-1] == "schedule")
            ]
        elif isinstance(node, ast.ImportFrom) and node.module == PRIMITIVES:
            node.names = [a for a in node.names if a.name not in ("Config", "schedule")]
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom) and not n.names)]
    try:
        return ast.unparse(tree)
    except RecursionError:
        return source


def _forward(tree: ast.Module) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "forward":
            return node
    raise ValueError("the module has no top-level forward")


def _schedule_decorator(fn: ast.FunctionDef) -> ast.Call | None:
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and ast.unparse(dec.func).split(".")[-1] == "schedule":
            return dec
    return None


def pinned_schedule(source: str) -> dict[ScheduleKey, Config]:
    """The table of forward's ``@schedule({...})``; empty when it has none (or the source is not a valid
    module)."""
    try:
        dec = _schedule_decorator(_forward(ast.parse(source)))
    # any text: NUL bytes, nesting the parser gives up on
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    if dec is None:
        return {}
    called = {ast.unparse(n.func) for n in ast.walk(dec) if isinstance(n, ast.Call) and n is not dec}
    try:
        return literal_schedule(dec, {name for name in called if name.split(".")[-1] == "Config"})
    except ScheduleFormError:
        return {}


def pinned_notes(source: str, measured: Collection[str] = ()) -> list[str]:
    """The lines of the comment :func:`pin_schedule` wrote above forward's ``@schedule``, after its first (the
    heading), less those that open with a shape named in ``measured`` (``  name: ...``): what a re-tune at
    other shapes keeps, since the configs those lines measured stay pinned."""
    try:
        dec = _schedule_decorator(_forward(ast.parse(source)))
    # any text: NUL bytes, nesting the parser gives up on
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    if dec is None:
        return []
    lines = source.splitlines()
    notes: list[str] = []
    at = dec.lineno - 2
    while at >= 0 and lines[at].startswith(NOTE_MARK):
        notes.insert(0, lines[at][len(NOTE_MARK) + 1:])
        at -= 1
    return [n for n in notes[1:] if n.strip().split(":")[0] not in measured]


def pin_schedule(source: str, table: Schedule, notes: Sequence[str] = ()) -> str:
    """``source`` with ``@schedule({...})`` on forward: ``table`` over the schedule it already pins, under
    ``notes`` as comment lines; imports ``Config``/``schedule`` from the primitives when the module does not.

    Raises ScheduleFormError when the result would not pass the static check (a module that binds those
    names to something else).
    """
    tree = ast.parse(source)
    fn = _forward(tree)
    old = _schedule_decorator(fn)
    merged = {**pinned_schedule(source), **table}
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    block = [f"{NOTE_MARK} {n}\n" for n in notes] + ["@schedule({\n"]
    block += [f"    {key!r}: {config_literal(c)},\n" for key, c in sorted(merged.items())] + ["})\n"]
    if old is not None:
        start, end = _pin_lines(lines, old)
    else:
        start = end = (fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno) - 1
    edits = [(start, end, block)]
    imported = {
        a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == PRIMITIVES and not n.level
        for a in n.names if a.asname in (None, a.name)
    }
    missing = [n for n in ("Config", "schedule") if n not in imported]
    clash = [n for n in missing if n in scope_bindings(tree)]
    if clash:
        raise ScheduleFormError(f"cannot pin a schedule: the module binds {', '.join(clash)} itself")
    if missing:
        edits.append(_import_edit(tree, lines, missing))
    # bottom up: indices stay valid
    for first, last, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        lines[first:last] = new
    pinned = "".join(lines)
    problems = check_source(pinned)
    if problems:
        raise ScheduleFormError(f"the pinned module fails the static check: {problems[0]}")
    return pinned


def unpinned(source: str) -> str:
    """``source`` without forward's ``@schedule`` and the comment lines :func:`pin_schedule` wrote above it,
    and without ``Config``/``schedule`` in a one-line primitives import where nothing else uses them; comments
    and layout otherwise as written. What a worked example shows: the schedule is the harness's to set. The
    source as given when it has no pin (or does not parse)."""
    try:
        tree = ast.parse(source)
        dec = _schedule_decorator(_forward(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return source
    if dec is None:
        return source
    lines = source.splitlines(keepends=True)
    start, end = _pin_lines(lines, dec)
    del lines[start:end]
    rest = ast.parse("".join(lines))
    unused = {"Config", "schedule"} - {n.id for n in ast.walk(rest) if isinstance(n, ast.Name)}
    for node in rest.body:
        if (isinstance(node, ast.ImportFrom) and node.module == PRIMITIVES and not node.level
                and node.lineno == node.end_lineno and all(a.asname is None for a in node.names)
                and unused & {a.name for a in node.names}):
            names = [a.name for a in node.names if a.name not in unused]
            lines[node.lineno - 1] = f"from {PRIMITIVES} import {', '.join(names)}\n" if names else ""
    return "".join(lines)


def _pin_lines(lines: Sequence[str], dec: ast.Call) -> tuple[int, int]:
    """The line range (0-based, end exclusive) of forward's ``@schedule`` decorator ``dec`` with the note
    lines :func:`pin_schedule` wrote above it."""
    start, end = dec.lineno - 1, dec.end_lineno or dec.lineno
    while start > 0 and lines[start - 1].startswith(NOTE_MARK):
        start -= 1
    return start, end


def _import_edit(tree: ast.Module, lines: list[str], names: list[str]) -> tuple[int, int, list[str]]:
    """The edit that imports ``names`` from the primitives: merged into the module's one-line
    ``from coda_agent.primitives import ...`` where it has one (names in isort's order, so the pinned module
    stays lint-clean), else a line of its own after the last import."""
    source = "".join(lines)
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and node.module == PRIMITIVES and not node.level):
            continue
        one_line = node.lineno == node.end_lineno and lines[node.lineno - 1].rstrip(
            "\n"
        ) == ast.get_source_segment(source, node)
        if one_line and all(a.asname is None for a in node.names):
            wanted = {a.name for a in node.names} | set(names)
            merged = sorted(wanted, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
            return node.lineno - 1, node.lineno, [f"from {PRIMITIVES} import {', '.join(merged)}\n"]
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    at = max((n.end_lineno or n.lineno) for n in imports) if imports else 0
    return at, at, [f"from {PRIMITIVES} import {', '.join(names)}\n"]


def schedule_text(table: Schedule) -> str:
    """``residual_rms 8192x4096x14336: 128x208 pingpong 2x1; ...`` for prompts and displays."""
    return "; ".join(f"{k[0]} {k[1]}x{k[2]}x{k[3]}: {config_label(c)}" for k, c in sorted(table.items()))
