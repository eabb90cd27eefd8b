"""Loading task files, with one clear message (file, field, problem) for anything malformed."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from pydantic import ValidationError

from .model import Task

#: Where the built-in task suite lives (the repository's ``tasks/`` folder).
DEFAULT_TASK_DIR = Path(__file__).resolve().parents[2] / "tasks"


class TaskError(Exception):
    """A task file (or its reference) is unusable; the message names the file and what is wrong."""


def _field_path(loc: tuple[Any, ...], data: Any) -> str:
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int):
            label = node[item].get("name") if isinstance(node, list) and item < len(node) and isinstance(node[item], dict) else None
            parts.append(f"[{item}]" + (f"({label})" if label else ""))
        else:
            parts.append(("." if parts else "") + str(item))
        try:
            node = node[item]
        except (KeyError, IndexError, TypeError):
            node = None
    return "".join(parts) or "(top level)"


def format_validation_error(path: Path, err: ValidationError, data: Any) -> str:
    lines = [f"{path}: invalid task file"]
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        lines.append(f"  {_field_path(tuple(e['loc']), data)}: {msg}")
    return "\n".join(lines)


def load_task(path: str | Path) -> Task:
    """Parse and schema-check one task YAML file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TaskError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise TaskError(f"{p}:{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise TaskError(f"{p}: a task file must be a YAML mapping, got {type(data).__name__}")
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        raise TaskError(format_validation_error(p, exc, data)) from None
    return task.bind_path(p.resolve())


def task_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and folders into the task YAML files they hold (sorted)."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found.extend(sorted(q for q in p.glob("*.yaml")))
        elif p.exists():
            found.append(p)
        else:
            raise TaskError(f"{p}: no such file or folder")
    return found


def load_tasks(paths: Iterable[str | Path] = (DEFAULT_TASK_DIR,)) -> list[Task]:
    return [load_task(p) for p in task_files(paths)]


def find_task(name_or_path: str, task_dir: Path = DEFAULT_TASK_DIR) -> Task:
    """A task by file path, or by name in the task folder."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return load_task(p)
    candidate = task_dir / f"{name_or_path}.yaml"
    if candidate.exists():
        return load_task(candidate)
    known = ", ".join(sorted(q.stem for q in task_dir.glob("*.yaml")))
    raise TaskError(f"no task named {name_or_path!r} in {task_dir} (known: {known})")


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


def reference_function(task: Task) -> Callable[..., dict[str, Any]]:
    """The task's FP32 reference ``fn(**inputs, **constants) -> {output: tensor}``."""
    path = task.reference_file
    if not path.exists():
        raise TaskError(f"{task.path}: reference: file {path.name} not found next to the task")
    try:
        module = import_file(path, f"coda_task_ref_{task.name.replace('-', '_')}")
    except Exception as exc:
        raise TaskError(f"{task.path}: reference: importing {path.name} failed: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, task.reference_function, None)
    if not callable(fn):
        raise TaskError(f"{task.path}: reference: {path.name} has no function {task.reference_function!r}")
    return fn
