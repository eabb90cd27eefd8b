"""The ``@schedule({...})`` on forward in its source form: the one literal form the static check accepts, read
without running anything, written (pinned) by the tuner and taken out when two candidates are compared.

The check, the tune stage and the prompt's feedback all read it here (this module imports no torch).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Collection, Sequence

from ...primitives import Config
from ...primitives._schedule import ScheduleKey
from ...primitives.configs import Schedule, config_label, config_literal
from .contract import PRIMITIVES
from .parse import parse_module
from .scopes import scope_bindings

#: The first line of the comment :func:`pin_schedule` writes above the decorator (and replaces on a re-tune).
NOTE_MARK = "# coda-agent tune:"


class ScheduleFormError(ValueError):
    """A ``@schedule(...)`` that is not a literal table of ``(name, M, N, K): Config(field=constant,
    ...)``."""


def literal_schedule(call: ast.Call,
                     config_names: Collection[str] = ("Config",)) -> dict[tuple[str, int, int, int], Config]:
    """The table of a ``schedule({...})`` call, read from its literal source without running anything.

    The one form accepted (and the one the harness writes): a single dict literal whose keys are
    ``("epilogue_name", M, N, K)`` tuples of constants and whose values are ``Config(...)`` calls
    (``config_names``: how the module names Config) with constant keyword fields. Raises
    :class:`ScheduleFormError` otherwise.
    """
    if len(call.args) != 1 or call.keywords or not isinstance(call.args[0], ast.Dict):
        raise ScheduleFormError("schedule() takes exactly one argument, a dict literal {(epilogue_name, M, "
                                "N, K): Config(...)}")
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
            raise ScheduleFormError("schedule keys must be literal (epilogue_name, M, N, K) tuples with "
                                    "positive integer dims")
        assert isinstance(key, tuple)
        if not (isinstance(v, ast.Call) and ast.unparse(v.func) in config_names and not v.args):
            raise ScheduleFormError(f"schedule entry {key!r} must be Config(field=value, ...) with keyword "
                                    "fields")
        values: dict[str, object] = {}
        for kw in v.keywords:
            if (
                kw.arg not in fields
                or not isinstance(kw.value, ast.Constant)
                or type(kw.value.value) is not fields[kw.arg]
            ):
                raise ScheduleFormError(f"schedule entry {key!r}: Config fields are "
                                        f"{', '.join(sorted(fields))}, each a constant integer ({flags}: "
                                        "True/False)")
            values[kw.arg] = kw.value.value
        if key in table:
            raise ScheduleFormError(f"schedule key {key!r} appears twice")
        table[key] = Config(**values)  # type: ignore[arg-type]
    return table


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
    from .rules import check_source  # the check reads the schedule's form from here, so it is imported on use

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
