"""``coda-agent validate``: a task must load, its reference must run, and it must not be degenerate.

Degenerate tasks are the ones a trivial candidate could pass (robust-kbench's filters): an output that is
near zero, constant, or that does not change when the inputs do; and an input that changes no output alone.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from .loader import TaskError, field_line, load_task, reference_function
from .model import Task, torch_dtype


@dataclass
class TaskReport:
    """What validation found for one task file (problems empty = valid)."""

    path: Path
    task: Task | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _run(task: Task, dims: dict[str, int], seed: int, fp32: bool,
         inputs: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    inputs = task.make_inputs(dims, seed) if inputs is None else inputs
    if fp32:
        inputs = {k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()}
    with torch.no_grad():
        out = reference_function(task)(**inputs, **task.constants)
    if not isinstance(out, dict):
        raise TaskError(f"{task.path}: reference must return a dict of outputs, got {type(out).__name__}")
    return out


def _field(task: Task, loc: tuple[str | int, ...]) -> str:
    """``line 18: outputs[0](h)``: a field of the task file, as load errors name it (the line of its name)."""
    try:
        root = yaml.compose(task.path.read_text())
    except (OSError, yaml.YAMLError):
        root = None
    line = field_line(root, (*loc, "name"))
    label = f"{loc[0]}[{loc[1]}]({task.outputs[int(loc[1])].name if loc[0] == 'outputs' else task.inputs[int(loc[1])].name})"
    return (f"line {line}: " if line else "") + label


def _names_match(task: Task, returned: set[str]) -> list[str]:
    """One line per output the reference does not return (naming what it returns instead), and one for what it
    returns undeclared; none when the names agree. The checks after this one need them to."""
    declared = [o.name for o in task.outputs]
    extra = sorted(returned - set(declared))
    problems = []
    for i, name in enumerate(declared):
        if name not in returned:
            close = difflib.get_close_matches(name, extra, n=1, cutoff=0.5)
            instead = f"; it returns {close[0]!r} (a typo in one of the two?)" if close else f" (it returns {', '.join(sorted(returned)) or 'none'})"
            problems.append(f"{_field(task, ('outputs', i))}: the reference does not return output {name!r}{instead}")
            if close:
                extra.remove(close[0])
    if extra:
        problems.append(f"{task.reference}: the reference returns undeclared outputs {', '.join(extra)} (declare them under outputs)")
    return problems


def validate_task(task: Task) -> list[str]:
    """Problems with a loaded task (schema already checked): the reference on every small shape. One line per
    mistake: a problem met at several shapes is said once, with the shapes; a misnamed output stops the checks
    that would only repeat it."""
    problems: list[str] = []
    if task.human_file is not None and not task.human_file.exists():
        problems.append(f"human: {task.human} not found")
    found: dict[str, list[str]] = {}  # what is wrong, with what -> its message, then the other shapes it holds at

    def add(where: str, key: str, message: str) -> None:
        if key in found:
            found[key].append(where)
        else:
            found[key] = [f"{where}: {message}"]

    for point in task.shape("small"):
        where = f"shape small/{point.name}"
        try:
            lowp = _run(task, point.dims, 0, fp32=False)
            ref = _run(task, point.dims, 0, fp32=True)
            other = _run(task, point.dims, 1, fp32=True)
        except TaskError as exc:
            return [str(exc)]
        except Exception as exc:
            return [f"{where}: the reference raised {type(exc).__name__}: {exc}"]
        misnamed = _names_match(task, set(lowp))
        if misnamed:
            return problems + misnamed
        for spec in task.outputs:
            want = spec.concrete_shape(point.dims)
            got = lowp[spec.name]
            if tuple(got.shape) != want:
                add(where, f"shape {spec.name}", f"output {spec.name!r} has shape {tuple(got.shape)}, the task declares {want}")
            if got.dtype != torch_dtype(spec.dtype):
                add(where, f"dtype {spec.name}", f"output {spec.name!r} comes back as {got.dtype} in the task dtype, declared {spec.dtype}")
            r, o = ref[spec.name].double(), other[spec.name].double()
            if not bool(torch.isfinite(r).all()):
                add(where, f"finite {spec.name}", f"output {spec.name!r} of the FP32 reference has NaN/Inf")
                continue
            scale = float(r.abs().max())
            if scale < 1e-6:
                add(where, f"zero {spec.name}", f"output {spec.name!r} is near zero (max |x| = {scale:.2g}); zeros would pass")
            elif r.numel() > 1 and float(r.std()) < 1e-6 * scale:
                add(where, f"constant {spec.name}", f"output {spec.name!r} is constant; a constant would pass")
            if torch.equal(r, o):
                add(where, f"fixed {spec.name}", f"output {spec.name!r} does not change when the inputs change")
        for name in _ignored_inputs(task, point.dims, ref):
            add(where, f"ignored {name}", f"no output changes when input {name!r} alone does; a candidate could ignore it")
        if problem := _stress_problem(task, point.dims):
            add(where, "stress", problem)
    for first, *others in found.values():
        problems.append(first + (f" (also at {', '.join(w.removeprefix('shape ') for w in others)})" if others else ""))
    return problems


def _stress_problem(task: Task, dims: dict[str, int]) -> str | None:
    """Why the stress set (:meth:`Task.stress_inits`) cannot judge a candidate here, or None: the FP32 reference and
    the task-dtype one (the tolerance's baseline) must both stay finite on it, else every candidate fails there."""
    stressed = task.stress_inits()
    if not stressed:
        return None
    inputs = task.make_inputs(dims, 0, stress=True)
    for label, fp32 in (("FP32", True), ("task-dtype", False)):
        out = _run(task, dims, 0, fp32=fp32, inputs=inputs)
        bad = [o.name for o in task.outputs if o.name in out and not bool(torch.isfinite(out[o.name]).all())]
        if bad:
            block = "its stress: block" if task.stress is not None else f"the default stress set ({', '.join(sorted(stressed))} at large magnitudes)"
            return (f"on {block} the {label} reference's output {bad[0]!r} has NaN/Inf, so no candidate could pass it; "
                    "declare a stress: block the reference stays finite on (stress: {} for none)")
    return None


def _ignored_inputs(task: Task, dims: dict[str, int], ref: dict[str, torch.Tensor]) -> list[str]:
    """The inputs that, drawn again while the others stay, change no output of the FP32 reference (an input
    drawn the same for every seed, such as positions, is not asked about)."""
    first, second = task.make_inputs(dims, 0), task.make_inputs(dims, 1)
    ignored = []
    for name in first:
        if torch.equal(first[name], second[name]):
            continue
        out = _run(task, dims, 0, fp32=True, inputs={**first, name: second[name]})
        if all(torch.equal(out[spec.name], ref[spec.name]) for spec in task.outputs if spec.name in out):
            ignored.append(name)
    return ignored


def validate_path(path: Path) -> TaskReport:
    report = TaskReport(path)
    try:
        report.task = load_task(path)
    except TaskError as exc:
        report.problems.append(str(exc))
        return report
    report.problems.extend(validate_task(report.task))
    return report
