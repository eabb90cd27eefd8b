"""Loading task files, with one clear message (file, field, problem) for anything malformed."""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from pydantic import ValidationError

from .model import FieldProblems, Loc, Task

#: The built-in task suite: YAML files, their references and ``human/`` kernels, shipped inside the package.
BUILTIN_TASK_DIR = Path(__file__).resolve().parents[1] / "suite"
#: More task folders, searched after the built-in suite (``os.pathsep``-separated, like PATH).
TASKS_ENV = "CODA_AGENT_TASKS"
#: A ``tasks/`` folder in the working directory is searched last.
LOCAL_TASK_DIR = Path("tasks")


class TaskError(Exception):
    """A task file (or its reference) is unusable; the message names the file and what is wrong."""


def _field_path(loc: tuple[Any, ...], data: Any) -> str:
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int):
            label = (
                node[item].get("name")
                if isinstance(node, list) and item < len(node) and isinstance(node[item], dict)
                else None
            )
            parts.append(f"[{item}]" + (f"({label})" if label else ""))
        else:
            parts.append(("." if parts else "") + str(item))
        try:
            node = node[item]
        except (KeyError, IndexError, TypeError):
            node = None
    return "".join(parts) or "(top level)"


def field_line(root: yaml.Node | None, loc: Loc) -> int | None:
    """The line (1-based) of the field at ``loc`` in a composed YAML document, or of the nearest field above
    it that is there (a missing field: the mapping that lacks it)."""
    node, line = root, None
    for item in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value
                        == str(item)), None)
            if hit is None:
                break
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(item, int) and 0 <= item < len(node.value):
            node = node.value[item]
            line = node.start_mark.line + 1
        else:
            break
    else:
        if node is not None and line is None:
            line = node.start_mark.line + 1
    return line


def format_validation_error(path: Path, err: ValidationError, data: Any, text: str = "") -> str:
    """``path: invalid task file`` and one line per mistake: ``  line N: field.path: what is wrong``."""
    try:
        root = yaml.compose(text) if text else None
    except yaml.YAMLError:
        root = None
    found: list[tuple[Loc, str]] = []
    for e in err.errors():
        loc: Loc = tuple(e["loc"])
        raised = (e.get("ctx") or {}).get("error")
        if isinstance(raised, FieldProblems):  # the task's own checks: each mistake at its own field
            found += [((*loc, *where), msg) for where, msg in raised.problems]
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "literal_error":  # pydantic's "Input should be", read as the task's inputs in outputs
            msg = msg.replace("Input should be", "must be", 1)
        if e["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        found.append((loc, msg))
    found = _typos_named(found, err)
    lines = [f"{path}: invalid task file"]
    for loc, msg in found:
        line = field_line(root, loc) if loc else None
        lines.append("  " + (f"line {line}: " if line else "") + f"{_field_path(loc, data)}: {msg}")
    return "\n".join(lines)


def _typos_named(found: list[tuple[Loc, str]], err: ValidationError) -> list[tuple[Loc, str]]:
    """An unknown field that is a required one misspelt (``launch_budgt``) is one mistake, not two: the
    unknown field names the one it is like, and the "Field required" it caused goes."""
    missing = {tuple(e["loc"]) for e in err.errors() if e["type"] == "missing"}
    explained: set[Loc] = set()
    out = []
    for loc, msg in found:
        if msg == "unknown field (typo?)" and loc and isinstance(loc[-1], str):
            siblings = [m[-1] for m in missing if m[:-1] == loc[:-1] and isinstance(m[-1], str)]
            close = difflib.get_close_matches(loc[-1], siblings, n=1)
            if close:
                msg = f"unknown field; did you mean {close[0]}?"
                explained.add((*loc[:-1], close[0]))
        out.append((loc, msg))
    return [(loc, msg) for loc, msg in out if loc not in explained]


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line error as one line: `` line L, column C: not valid YAML (what)``."""
    mark = getattr(exc, "problem_mark", None)
    where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{where}: not valid YAML ({getattr(exc, 'problem', None) or str(exc).splitlines()[0]})"


def load_task(path: str | Path) -> Task:
    """Parse and schema-check one task YAML file; its ``human:`` kernel, when named, must be there (every
    command that lists, checks or runs the task says the same about it)."""
    p = Path(path)
    if p.suffix == ".py":
        raise TaskError(python_given(p))
    try:
        text = p.read_text()
    except OSError as exc:
        raise TaskError(f"{p}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise TaskError(f"{p}: not a text file (a task is a YAML file)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TaskError(f"{p}:{yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise TaskError(f"{p}: a task file must be a YAML mapping, got {type(data).__name__}")
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise TaskError(format_validation_error(p, exc, data, text)) from None
    task.bind_path(p.resolve())
    if task.human_file is not None and not task.human_file.is_file():
        line = field_line(yaml.compose(text), ("human",))
        raise TaskError(f"{p}: invalid task file\n  line {line}: human: {task.human} not found next to the "
                        "task (the field is optional: fix the path, or drop the line for a task without a "
                        "human kernel)")
    return task


def python_given(path: Path) -> str:
    """What to pass instead of a Python file given as a task: the task file beside it (or in the folder above,
    as for ``human/`` kernels) that names it as its reference or its human kernel, else what a task file
    is."""
    for yaml_file in [*sorted(path.parent.glob("*.yaml")), *sorted(path.parent.parent.glob("*.yaml"))]:
        try:
            data = yaml.safe_load(yaml_file.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if not isinstance(data, dict):
            continue
        if (yaml_file.parent / str(data.get("reference", "")).split(":", 1)[0]).resolve() == path.resolve():
            return f"{path}: the reference of a task, not a task file; pass the task: {yaml_file}"
        if data.get("human") and (yaml_file.parent / str(data["human"])).resolve() == path.resolve():
            return f"{path}: the human kernel of a task, not a task file; pass the task: {yaml_file}"
    return (f"{path}: a Python file, not a task file; pass the task's YAML file (the one whose reference: "
            "names this file)")


#: The keys that make a YAML file a task file: one in a folder of tasks with none of them (a mock script, a CI
#: config) is no task, and every command skips it alike (a task file with a mistake is reported, not skipped).
TASK_KEYS = ("inputs", "outputs", "reference")


def not_a_task(path: Path) -> str | None:
    """Why ``path`` (a YAML file in a folder of tasks) is no task file; None when it is one, or may be one
    with a mistake (unreadable or not valid YAML: loading it says what is wrong)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if isinstance(data, dict) and any(k in data for k in TASK_KEYS):
        return None
    return f"{path}: not a task file (none of {', '.join(TASK_KEYS)})"


def task_files(paths: Iterable[str | Path], skipped: list[str] | None = None) -> list[Path]:
    """Expand files and folders into the task YAML files they hold (sorted). A folder's YAML files that are no
    task files (:func:`not_a_task`) are left out, each with one line in ``skipped``; a file named itself is
    kept."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for q in sorted(p.glob("*.yaml")):
                why = not_a_task(q)
                if why is None:
                    found.append(q)
                elif skipped is not None:
                    skipped.append(why)
        elif p.exists():
            found.append(p)
        else:
            raise TaskError(f"{p}: no such file or folder")
    return found


@dataclass(frozen=True)
class TaskSource:
    """A folder tasks are found in by name, and how it came to be searched (shown by ``coda-agent tasks``)."""

    label: str  # "built-in", "CODA_AGENT_TASKS" or "./tasks"
    folder: Path


def task_sources() -> list[TaskSource]:
    """The folders searched for a task name, in order: the built-in suite, ``$CODA_AGENT_TASKS``,
    ``./tasks``."""
    sources = [TaskSource("built-in", BUILTIN_TASK_DIR)]
    for raw in os.environ.get(TASKS_ENV, "").split(os.pathsep):
        if raw.strip():
            folder = Path(raw.strip()).expanduser()
            if not folder.is_dir():
                raise TaskError(f"{TASKS_ENV}: {folder}: no such folder (fix the path in ${TASKS_ENV}, or "
                                "unset it)")
            sources.append(TaskSource(TASKS_ENV, folder))
    if LOCAL_TASK_DIR.is_dir():
        sources.append(TaskSource("./tasks", LOCAL_TASK_DIR))
    seen: set[Path] = set()
    unique = []
    for s in sources:
        if s.folder.resolve() not in seen:
            seen.add(s.folder.resolve())
            unique.append(s)
    return unique


def discover_task_files(skipped: list[str] | None = None,
                        every: bool = False) -> list[tuple[TaskSource, Path]]:
    """Every task file on the search path, in search order: the first of each file name only, or with
    ``every`` the later ones of a name too (a copy in ``./tasks`` of a built-in: ``tasks`` lists both)."""
    found: dict[str, list[tuple[TaskSource, Path]]] = {}
    for source in task_sources():
        for path in task_files([source.folder], skipped):
            found.setdefault(path.stem, []).append((source, path))
    return [hit for hits in found.values() for hit in (hits if every else hits[:1])]


def load_tasks(paths: Iterable[str | Path] | None = None) -> list[Task]:
    """The tasks in ``paths`` (files or folders), or every task on the search path."""
    files = task_files(paths) if paths is not None else [p for _, p in discover_task_files()]
    return [load_task(p) for p in files]


def find_task(name_or_path: str) -> Task:
    """A task by file path, or by name on the search path (see :func:`task_sources`). A name that two
    different tasks answer to (an edited copy of a built-in in ``./tasks``) is refused, naming both files: the
    user passes the path of the one meant. Identical copies are one task."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if p.is_dir():
            raise TaskError(f"{p}: a folder, not a task file (pass a task name or a .yaml file)")
        return load_task(p)
    by_file_name = [s.folder / f"{name_or_path}.yaml" for s in task_sources()]
    found = [(path, load_task(path)) for path in by_file_name if path.is_file()]
    if not found:  # a file named otherwise than its task's name: field (as `tasks` lists it)
        for _, path in discover_task_files(every=True):
            try:
                task = load_task(path)
            except TaskError:
                continue
            if task.name == name_or_path:
                found.append((path, task))
    if found:
        return _the_one(name_or_path, [task for _, task in found])
    names = known_task_names()
    close = difflib.get_close_matches(name_or_path, names, n=1, cutoff=0.7)
    hint = f"did you mean {close[0]}? " if close else ""
    raise TaskError(f"no task named {name_or_path!r} in {searched()} ({hint}known: {', '.join(names)})")


def _the_one(name: str, tasks: list[Task]) -> Task:
    """The task a name stands for: the first found, where every other is the same task (the same content)."""
    differ = [t for t in tasks[1:] if t.content_hash != tasks[0].content_hash]
    if not differ:
        return tasks[0]
    places = " and ".join(f"{t.path} (content {t.content_hash})" for t in (tasks[0], *differ))
    raise TaskError(f"task name {name!r} stands for {len(differ) + 1} different tasks: {places}; pass the "
                    "path of the one you mean instead of the name, or give the copy a name of its own (its "
                    "name: and file name)")


def searched() -> str:
    """Every place a task name is looked for, those that are not there included (where a task may go)."""
    where = [f"the built-in suite {BUILTIN_TASK_DIR}"]
    where += [f"${TASKS_ENV} {s.folder}" for s in task_sources() if s.label == TASKS_ENV]
    if not os.environ.get(TASKS_ENV, "").strip(os.pathsep + " "):
        where.append(f"${TASKS_ENV} (not set)")
    where.append("./tasks" if LOCAL_TASK_DIR.is_dir() else "./tasks (no such folder here)")
    return ", ".join(where)


def known_task_names() -> list[str]:
    """The tasks on the search path by their ``name:``, as ``coda-agent tasks`` lists them (a file that does
    not load is listed by its file name)."""
    names = set()
    for _, path in discover_task_files():
        try:
            names.add(load_task(path).name)
        except TaskError:
            names.add(path.stem)
    return sorted(names)


def find_recorded_task(path: str, name: str) -> Task:
    """The task a run record names: its file if it is still there, else the task of that name on the search
    path (records made before the suite moved into the package name ``<repo>/tasks/...``)."""
    if Path(path).is_file():
        return load_task(path)
    return find_task(name)


def import_file(path: Path, module_name: str) -> ModuleType:
    """Import a Python file as a fresh module (source stays inspectable, tracebacks show its lines)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def upcast(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Floating inputs in FP32 (the FP32 reference's view of the same data); integer inputs unchanged."""
    return {k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()}


def reference_function(task: Task) -> Callable[..., dict[str, Any]]:
    """The task's FP32 reference ``fn(**inputs, **constants) -> {output: tensor}``."""
    path = task.reference_file
    if not path.exists():
        raise TaskError(f"{task.path}: reference: file {path.name} not found next to the task (fix "
                        f"reference: to name the .py file beside the task, as file.py:function)")
    try:
        module = import_file(path, f"coda_task_ref_{task.name.replace('-', '_')}")
    except Exception as exc:
        raise TaskError(
            f"{task.path}: reference: importing {path.name} failed: {type(exc).__name__}: {exc}"
        ) from None
    fn = getattr(module, task.reference_function, None)
    if not callable(fn):
        raise TaskError(f"{task.path}: reference: {path.name} has no function {task.reference_function!r}")
    return fn
