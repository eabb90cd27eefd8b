"""``coda-agent validate``: a task must load, its reference must run, and it must not be degenerate.

Degenerate tasks are the ones a trivial candidate could pass (robust-kbench's filters): an output that is
near zero, constant, or that does not change when the inputs do; an input that changes no output alone; and a
constant the test data never reaches (a clamp above every value) or a term of a sum it keeps too small to see
(:mod:`.terms`), which a kernel could leave out. A task is also
refused where no kernel could run it: a shape whose tensors' rows TMA cannot move (the primitives' own rule).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from ..primitives._config import TMA_ALIGN_BYTES, tma_row_multiple
from . import expr
from .loader import TaskError, field_line, load_task, reference_function, upcast
from .model import DTYPE_BYTES, InputSpec, Loc, Task, TensorSpec, delicate_operators, torch_dtype
from .products import Products, reference_products, row_width_symbols
from .terms import Term, dropped_term, invisible_terms, within_tolerance

#: How validate moves each constant (a factor; a zero moves by the factor less one): each move must change an
#: output at some small shape's test data, or the data never reaches what the constant does (a clamp above
#: every value, a mask value no input holds) and a kernel without it passes verify.
CONSTANT_MOVES = (1.5, 0.5)
#: How far validate moves a float constant up (an eps 100 times too large) for one the test data cannot tell.
EPS_MOVE = 100.0
#: How much wider than its init an input is drawn to find the ones whose spread would reach an inert constant.
WIDER = 4.0

Tensors = dict[str, torch.Tensor]
#: Each small shape's dims, its inputs (seed 0) and the FP32 reference's outputs at them.
Runs = list[tuple[dict[str, int], Tensors, Tensors]]


@dataclass
class TaskReport:
    """What validation found for one task file (problems empty = valid)."""

    path: Path
    task: Task | None = None
    problems: list[str] = field(default_factory=list)
    #: What the task lets a kernel get away with that is no mistake of its own: said, not refused.
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _run(task: Task, inputs: Tensors, fp32: bool, constants: dict[str, float | int] | None = None) -> Tensors:
    """The reference's outputs at ``inputs`` (upcast first where ``fp32``), under the task's constants or
    ``constants`` over them."""
    if fp32:
        inputs = upcast(inputs)
    with torch.no_grad():
        out = reference_function(task)(**inputs, **{**task.constants, **(constants or {})})
    if not isinstance(out, dict):
        raise TaskError(f"{task.path}: reference must return a dict of outputs, got {type(out).__name__}")
    return out


def _at(task: Task, loc: Loc) -> str:
    """``line 18: ``: where the field at ``loc`` is in the task file (empty where it cannot be read again)."""
    try:
        root = yaml.compose(task.path.read_text())
    except (OSError, yaml.YAMLError):
        root = None
    line = field_line(root, loc)
    return f"line {line}: " if line else ""


def _label(task: Task, loc: Loc) -> str:
    """``outputs[0](h)``: a tensor of the task file, as load errors name it."""
    tensors: Sequence[TensorSpec] = task.outputs if loc[0] == "outputs" else task.inputs
    return f"{loc[0]}[{loc[1]}]({tensors[int(loc[1])].name})"


def _field(task: Task, loc: tuple[str | int, ...]) -> str:
    """``line 18: outputs[0](h)``: a tensor of the task file, at the line of its name."""
    return _at(task, (*loc, "name")) + _label(task, loc)


def _names_match(task: Task, returned: set[str]) -> list[str]:
    """One line per output the reference does not return (naming what it returns instead), and one for what it
    returns undeclared; none when the names agree. The checks after this one need them to."""
    declared = [o.name for o in task.outputs]
    extra = sorted(returned - set(declared))
    problems = []
    for i, name in enumerate(declared):
        if name not in returned:
            close = difflib.get_close_matches(name, extra, n=1, cutoff=0.5)
            instead = (
                f"; it returns {close[0]!r} (a typo in one of the two?)"
                if close
                else f" (it returns {', '.join(sorted(returned)) or 'none'})"
            )
            problems.append(f"{_field(task, ('outputs', i))}: the reference does not return output "
                            f"{name!r}{instead}")
            if close:
                extra.remove(close[0])
    if extra:
        problems.append(f"{task.reference}: the reference returns undeclared outputs {', '.join(extra)} "
                        "(declare them under outputs)")
    return problems


def validate_task(task: Task) -> list[str]:
    """Problems with a loaded task (schema already checked): the reference on every small shape. One line per
    mistake: a problem met at several shapes is said once, with the shapes; a misnamed output stops the checks
    that would only repeat it."""
    return _findings(task)[0]


def _findings(task: Task) -> tuple[list[str], list[str]]:
    """:func:`validate_task`'s problems, and notes: what the task lets a kernel get away with that is no
    mistake of its own (an ``eps`` whose absence no tolerance sees)."""
    made, batched = _reference_products(task)
    problems = _misaligned_shapes(task, row_width_symbols(task, made) if task.gemms and not batched else None)
    # what is wrong, with what -> its message, then the other shapes it holds at
    found: dict[str, list[str]] = {}

    def add(where: str, key: str, message: str) -> None:
        if key in found:
            found[key].append(where)
        else:
            found[key] = [f"{where}: {message}"]

    runs: Runs = []
    # inputs, FP32 outputs, the tolerance baseline's outputs
    judged: list[tuple[Tensors, Tensors, Tensors]] = []
    for point in task.shape("small"):
        where = f"shape small/{point.name}"
        try:
            inputs = task.make_inputs(point.dims, 0)
            drawn = {name: t.clone() for name, t in inputs.items()}
            lowp = _run(task, inputs, fp32=False)
            if changed := _changed_inputs(task, drawn, inputs):
                return [*problems, f"{where}: {changed}"], []
            ref = _run(task, inputs, fp32=True)
            again = _run(task, inputs, fp32=True)
            other = _run(task, task.make_inputs(point.dims, 1), fp32=True)
        except TaskError as exc:
            return [*problems, str(exc)], []
        except Exception as exc:
            return [*problems, f"{where}: the reference raised {type(exc).__name__}: {exc}"], []
        runs.append((point.dims, inputs, ref))
        judged.append((inputs, ref, _baseline(task, lowp, ref)))
        misnamed = _names_match(task, set(lowp))
        if misnamed:
            return problems + misnamed, []
        random = [o.name for o in task.outputs if not _same(again[o.name], ref[o.name])]
        if random:
            # its tolerance would measure two draws apart: every other check would read that noise
            return [*problems, f"{where}: output {random[0]!r} differs between two runs of the reference on "
                               "the same inputs (it draws random numbers: a dropout?), so no kernel could "
                               "match it: make the randomness an input (a mask the task draws)"], []
        for spec in task.outputs:
            want = spec.concrete_shape(point.dims)
            got = lowp[spec.name]
            if tuple(got.shape) != want:
                add(where, f"shape {spec.name}",
                    f"output {spec.name!r} has shape {tuple(got.shape)}, the task declares {want}")
            if got.dtype != torch_dtype(spec.dtype):
                add(where, f"dtype {spec.name}", f"output {spec.name!r} comes back as {got.dtype} in the "
                                                 f"task dtype, declared {spec.dtype}")
            r, o = ref[spec.name].double(), other[spec.name].double()
            if not bool(torch.isfinite(r).all()):
                add(where, f"finite {spec.name}", f"output {spec.name!r} of the FP32 reference has NaN/Inf")
                continue
            if (task.tolerance.baseline == "eager" and got.is_floating_point()
                    and not bool(torch.isfinite(got).all())):
                add(where, f"finite lowp {spec.name}",
                    f"output {spec.name!r} of the task-dtype reference, the baseline the tolerance scales "
                    "with, has NaN/Inf on the ordinary inputs, so the allowance would be infinite and any "
                    "output pass: compute it stably (a max subtracted before exp) or choose tolerance: "
                    "{baseline: single_rounding}")
            scale = float(r.abs().max())
            if scale < 1e-6:
                add(where, f"zero {spec.name}",
                    f"output {spec.name!r} is near zero (max |x| = {scale:.2g}); zeros would pass")
            elif r.numel() > 1 and float(r.std()) < 1e-6 * scale:
                add(where, f"constant {spec.name}",
                    f"output {spec.name!r} is constant; a constant would pass")
            if torch.equal(r, o):
                add(where, f"fixed {spec.name}",
                    f"output {spec.name!r} does not change when the inputs change")
        ignored = _ignored_inputs(task, point.dims, ref)
        for name in ignored:
            index = next(i for i, s in enumerate(task.inputs) if s.name == name)
            add(where, f"ignored {name}",
                f"{_field(task, ('inputs', index))}: no output changes when it alone does; a candidate could "
                "ignore it: drop it, or use it in the reference")
        for name in _constant_enough(task, judged[-1], skip=set(ignored)):
            index = next(i for i, s in enumerate(task.inputs) if s.name == name)
            add(where, f"flat {name}",
                f"{_field(task, ('inputs', index))}: replaced by its mean (one value everywhere) it moves no "
                "output past twice the tolerance, so a candidate could ignore it: draw it with a wider "
                "spread (init: {dist: uniform, low: 0.5, high: 1.5} for a norm's weight)")
        ordinary_finite = all(bool(torch.isfinite(ref[s.name]).all()) for s in task.outputs if s.name in ref)
        # a reference already NaN on the ordinary inputs is that line's to fix, not the stress set's
        if ordinary_finite and (problem := _stress_problem(task, point.dims)):
            add(where, "stress", problem)
    for first, *others in found.values():
        problems.append(first + (f" (also at {', '.join(w.removeprefix('shape ') for w in others)})" if others
                                 else ""))
    problems += _unmade_gemms(task, made, batched) + _outputs_at_bench_shapes(task)
    problems += _inert_constants(task, runs)
    problems += [
        f"{term.describe(task.reference_file)} moves no output past twice the tolerance at the small shapes' "
        f"test data when it is left out, so a kernel could leave it out; {_showing(task, term, judged[0][0])}"
        for term in invisible_terms(task, judged)]
    return problems, [] if problems else (_droppable_constants(task, judged) + _unstressed(task)
                                          + _unreached_stress(task))


def _reference_products(task: Task) -> tuple[Products, bool]:
    """The reference's products (:func:`.products.reference_products`); where the reference raises, none, as
    if batched: the runs at the small shapes report the raise."""
    if not task.gemms:
        return {}, False
    try:
        return reference_products(task)
    except Exception:
        return {}, True


def _unmade_gemms(task: Task, made: Products, batched: bool) -> list[str]:
    """A listed GEMM no product of the reference matches, either way round: every correct kernel would be
    refused for not running it as a gemm() call (the verifier holds candidates to the list). Not judged where
    the reference multiplies in batches (bmm), whose products have no (M, N, K) of their own."""
    if not task.gemms or batched:
        return []
    point = task.shape("small")[0]
    products = ", ".join(map(str, made)) or "none"
    return [f"{_at(task, ('gemms', g))}gemms[{g}]: ({m}, {n}, {k}) at shape small/{point.name} is no "
            f"product the reference makes (its products (M, N, K): {products}); each listed GEMM must be a "
            "gemm() call in every kernel, so no kernel could pass: list the reference's products"
            for g, (m, n, k) in enumerate(task.gemm_shapes(point.dims))
            if (m, n, k) not in made and (n, m, k) not in made]


def _baseline(task: Task, lowp: Tensors, ref: Tensors) -> Tensors:
    """The outputs the tolerance measures a candidate's error against (:class:`.model.Tolerance`'s
    ``baseline``)."""
    if task.tolerance.baseline == "eager":
        return lowp
    return {o.name: ref[o.name].to(torch_dtype(o.dtype)) for o in task.outputs if o.name in ref}


def _stress_problem(task: Task, dims: dict[str, int]) -> str | None:
    """Why the stress set (:meth:`Task.stress_inits`) cannot judge a candidate here, or None: the FP32
    reference and the task-dtype one (the tolerance's baseline) must both stay finite on it, else every
    candidate fails there."""
    stressed = task.stress_inits()
    if not stressed:
        return None
    inputs = task.make_inputs(dims, 0, stress=True)
    for label, fp32 in (("FP32", True), ("task-dtype", False)):
        out = _run(task, inputs, fp32=fp32)
        bad = [o.name for o in task.outputs if o.name in out and not bool(torch.isfinite(out[o.name]).all())]
        if bad:
            block = "its stress: block" if task.stress is not None else ("the default stress set "
                                                                         f"({', '.join(sorted(stressed))} at "
                                                                         "large magnitudes)")
            return (f"on {block} the {label} reference's output {bad[0]!r} has NaN/Inf, so no candidate "
                    "could pass it; declare a stress: block the reference stays finite on (stress: {} for "
                    "none)")
    return None


def _ignored_inputs(task: Task, dims: dict[str, int], ref: dict[str, torch.Tensor]) -> list[str]:
    """The inputs that, drawn again while the others stay, change no output of the FP32 reference (an input
    drawn the same for every seed, such as positions, is not asked about)."""
    first, second = task.make_inputs(dims, 0), task.make_inputs(dims, 1)
    ignored = []
    for name in first:
        if torch.equal(first[name], second[name]):
            continue
        out = _run(task, {**first, name: second[name]}, fp32=True)
        if all(torch.equal(out[spec.name], ref[spec.name]) for spec in task.outputs if spec.name in out):
            ignored.append(name)
    return ignored


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal elements, NaN matching NaN (an FP32 reference's NaN is another check's to report)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all()) if a.is_floating_point() \
        else torch.equal(a, b)


def _changed_inputs(task: Task, drawn: Tensors, inputs: Tensors) -> str | None:
    """Which input the reference changed in place, as a problem, or None: a kernel must leave its inputs as
    they were, and the FP32 run would see the task-dtype run's changes (an FP32 input is not copied), so the
    tolerance's baseline would measure another computation."""
    for index, spec in enumerate(task.inputs):
        if spec.name in inputs and not torch.equal(inputs[spec.name], drawn[spec.name]):
            return (f"{_field(task, ('inputs', index))}: the reference changes it in place (an add_, an "
                    "out=, a slice assigned); a kernel must leave its inputs as they were, and the FP32 and "
                    "task-dtype runs would see other inputs: return the result as an output instead")
    return None


def _constant_enough(task: Task, run: tuple[Tensors, Tensors, Tensors], skip: set[str]) -> list[str]:
    """The floating inputs that, each replaced by its mean while the others stay, move no output past twice
    the tolerance (:func:`.terms.within_tolerance`): drawn constant or nearly (a norm weight of ones), they
    let a kernel ignore them."""
    inputs, ref, base = run
    found = []
    for name, t in inputs.items():
        if name in skip or not t.is_floating_point() or t.numel() < 2:
            continue
        flat = torch.full_like(t, float(t.double().mean()))
        try:
            out = _run(task, {**inputs, name: flat}, fp32=True)
        except Exception:
            continue  # a reference that cannot run so sees the input
        if within_tolerance(task, ref, base, out):
            found.append(name)
    return found


def _moved(value: float | int, factor: float) -> float | int:
    """``value`` moved by ``factor`` (a zero by ``factor - 1``; an int stays an int and moves by one at
    least)."""
    if isinstance(value, int):
        step = 1 if factor > 1 else -1
        moved = round(value * factor) if value else step
        return moved if moved != value else value + step
    return value * factor if value else factor - 1


def _changes(task: Task, inputs: Tensors, ref: Tensors, constants: dict[str, float | int]) -> bool:
    """Whether an output of the FP32 reference at ``inputs`` (``ref``) changes under ``constants`` (a
    reference that raises under them depends on them too)."""
    try:
        out = _run(task, inputs, fp32=True, constants=constants)
    except Exception:
        return True
    return any(not torch.equal(out[spec.name], ref[spec.name]) for spec in task.outputs if spec.name in out)


def _inert_constants(task: Task, runs: Runs) -> list[str]:
    """One line per constant that a move of :data:`CONSTANT_MOVES` changes no output with at any small shape:
    the test data never reaches what it does, so a kernel could leave it out and pass."""
    problems = []
    read = _names_read(task)
    for name, value in task.constants.items():
        inert = [(factor, _moved(value, factor)) for factor in CONSTANT_MOVES
                 if not any(_changes(task, inputs, ref,
                                     {name: _moved(value, factor)}) for _, inputs, ref in runs)]
        if not inert:
            continue
        where = f"{_at(task, ('constants', name))}constants.{name}"
        if read is not None and name not in read:
            problems.append(f"{where}: the reference never uses it; drop it")
            continue
        moves = " or ".join(f"to {moved:g} (x{factor:g})" for factor, moved in inert)
        problems.append(f"{where}: no output changes when it moves from {value:g} {moves} at the small "
                        "shapes: the test data never reaches it (or, reached, it changes nothing in FP32), "
                        f"so a kernel could leave it out; {_reaching(task, runs, {name: inert[0][1]})}")
    return problems


def _names_read(task: Task) -> set[str] | None:
    """The names the reference function's body reads (its parameters' uses, not their declaration); None
    where the function is not found in its file's source."""
    function = task.reference.partition(":")[2]
    for node in ast.walk(ast.parse(task.reference_file.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return {n.id for stmt in node.body for n in ast.walk(stmt)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return None


def _droppable_constants(task: Task, judged: Sequence[tuple[Tensors, Tensors, Tensors]]) -> list[str]:
    """A note per constant that the test data reaches (:func:`_inert_constants` passes it) but whose absence
    (0), or a value 100 times its own (a float's), moves no output past twice the tolerance
    (:func:`.terms.within_tolerance`): a kernel that drops it, or has it wrong, passes. Not a mistake: an
    ``eps`` that guards a division or a root is so at any data a task would draw."""
    notes = []
    for name, value in task.constants.items():
        if value == 0 or isinstance(value, bool):
            continue
        moves = [(0 * value, "leaves it out (0)")]
        if isinstance(value, float):
            moves.append((value * EPS_MOVE, f"uses {EPS_MOVE:g} x it ({value * EPS_MOVE:g})"))
        unseen = [what for moved, what in moves if _unseen(task, judged, {name: moved})]
        if unseen:
            notes.append(f"{_at(task, ('constants', name))}constants.{name}: a kernel that "
                         f"{' or '.join(unseen)} stays within the tolerance at the small shapes, so verify "
                         "cannot hold kernels to it (as usual for an eps that guards a division or a root); "
                         "to do so, give the test data values where it acts (rows of a tiny spread: init: "
                         "{replace: {value: 0.001, fraction: 0.05, rows: true}}; a row of zeros shows only "
                         "an eps that guards a division by another input's norm)")
    return notes


def _unseen(task: Task, judged: Sequence[tuple[Tensors, Tensors, Tensors]],
            constants: dict[str, float | int]) -> bool:
    """Whether the reference under ``constants`` stays within twice the tolerance at every small shape."""
    moved = []
    for inputs, _, _ in judged:
        try:
            moved.append(_run(task, inputs, fp32=True, constants=constants))
        except Exception:
            return False
    return all(within_tolerance(task, r, b, out) for (_, r, b), out in zip(judged, moved, strict=True))


def _unstressed(task: Task) -> list[str]:
    """A note where the reference calls a delicate operator but the task draws no stress set: every floating
    input has an init of its own (:meth:`Task.stress_inits` stresses only default-drawn ones), so a kernel
    that overflows at large magnitudes passes."""
    ops = delicate_operators(task.reference_file.read_text())
    if task.stress is not None or not ops or task.stress_inits():
        return []
    return [f"stress: the reference calls {', '.join(ops)}, but every floating input has an init of its own, "
            "so no stress set is drawn and a kernel unstable at large magnitudes passes; a stress: block "
            "checks it (stress: {x: {std: 64}} draws x there)"]


#: The aten ops of the delicate operators (:data:`.model.DELICATE_OPERATORS`, and ``/``), as a reference's
#: FP32 run dispatches them (softmax and cross-entropy as ``_softmax`` and ``_log_softmax``).
DELICATE_ATEN = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "logsumexp", "_softmax", "_log_softmax",
    "sigmoid", "silu", "tanh", "rsqrt", "sqrt", "reciprocal", "div", "erf", "erfc", "gelu", "gelu_backward",
    "softplus", "log_sigmoid_forward", "mish", "elu",
})
#: How much larger than on the ordinary test data a delicate op's operands must get on the stress set for the
#: set to count as reaching it.
STRESS_REACH = 4.0


class _OperandSizes(TorchDispatchMode):
    """The largest finite |value| among each delicate aten op's floating tensor operands, by op name; a
    division only where it divides by a tensor (``/ n`` by a number is no delicate quotient)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest: dict[str, float] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        divisor = args[1] if len(args) > 1 else None
        by_tensor = name != "div" or (isinstance(divisor, torch.Tensor) and divisor.dim() > 0)
        if name in DELICATE_ATEN and by_tensor:
            for t in (*args, *(kwargs or {}).values()):
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                    big = float(torch.nan_to_num(t.detach().abs(), posinf=0.0).max())
                    self.largest[name] = max(self.largest.get(name, 0.0), big)
        return func(*args, **(kwargs or {}))


def _operand_sizes(task: Task, inputs: Tensors) -> dict[str, float]:
    sizes = _OperandSizes()
    with sizes:
        _run(task, inputs, fp32=True)
    return sizes.largest


def _unreached_stress(task: Task) -> list[str]:
    """A note where the stress set redraws inputs, but none of them reaches the reference's delicate
    operators: their operands are no larger there than on the ordinary test data (a post-norm task's stressed
    residual is added after the rsqrt), so a kernel unstable at large magnitudes still passes."""
    stressed = task.stress_inits()
    if not stressed or not task.shape("small"):
        return []
    dims = task.shape("small")[0].dims
    try:
        ordinary = _operand_sizes(task, task.make_inputs(dims, 0))
        stress = _operand_sizes(task, task.make_inputs(dims, 0, stress=True))
    except Exception:  # the runs at the small shapes report a reference that raises
        return []
    if not ordinary or any(stress.get(op, 0.0) > STRESS_REACH * size for op, size in ordinary.items()):
        return []
    drawn = ", ".join(sorted(stressed))
    ops = ", ".join(sorted(ordinary))
    block = "its stress: block" if task.stress is not None else "the default stress set"
    return [f"stress: {block} redraws {drawn} at large magnitudes, but the operands of the reference's "
            f"{ops} are no larger there than on the ordinary test data (those inputs do not reach them), so "
            "a kernel unstable at large magnitudes passes; a stress: block names the inputs that do reach "
            "them (stress: {x: {std: 64}} draws x there)"]


def _reaching(task: Task, runs: Runs, constants: dict[str, float | int]) -> str:
    """The fix for a constant the test data never reaches: the inputs that, drawn :data:`WIDER` times as wide,
    would reach it (their inits to widen), else test data where it acts."""
    wider = []
    for i, spec in enumerate(task.inputs):
        if spec.init.dist in ("randint", "softmax") or not torch_dtype(spec.dtype).is_floating_point:
            continue
        for dims, inputs, _ in runs:
            widened = {**inputs, spec.name: _widened(task, spec, dims, inputs[spec.name])}
            if _changes(task, widened, _run(task, widened, fp32=True), constants):
                wider.append(_label(task, ("inputs", i)))
                break
    if wider:
        return f"widen the init of {' or '.join(wider)} ({WIDER:g}x as wide, it acts)"
    return ("give the test data values where it acts (a wider init, an init.replace; `rows: true` replaces "
            "whole rows, the zero rows a norm's eps guards)")


def _showing(task: Task, term: Term, inputs: Tensors) -> str:
    """The fix for a term the test data keeps too small to see: the inputs whose draw, with a mean of one
    std or :data:`WIDER` times as wide, makes its absence seen at the first small shape (a ratio such as a
    mean over a row's values is the same at any spread: only a mean shows it), else the general advice."""
    found = []
    dims = task.shape("small")[0].dims
    for i, spec in enumerate(task.inputs):
        if spec.init.dist in ("randint", "softmax") or not torch_dtype(spec.dtype).is_floating_point:
            continue
        label = _label(task, ("inputs", i))
        drawn = inputs[spec.name]
        drawn_as = {"a mean of one std (init: {mean: ...})": _shifted(task, spec, dims, drawn),
                    f"{WIDER:g}x its spread (init: {{std: ...}})": _widened(task, spec, dims, drawn)}
        for how, moved in drawn_as.items():
            redrawn = {**inputs, spec.name: moved.to(drawn.dtype)}
            ref = _run(task, redrawn, fp32=True)
            base = _baseline(task, _run(task, redrawn, fp32=False), ref)
            if not within_tolerance(task, ref, base, dropped_term(task, redrawn, term)):
                found.append(f"{label} drawn with {how}")
                break
    if found:
        return f"draw the inputs that feed it where it counts: {' or '.join(found)} shows it"
    if task.tolerance.baseline == "eager":
        ref = _run(task, inputs, fp32=True)
        once = {o.name: ref[o.name].to(torch_dtype(o.dtype)) for o in task.outputs if o.name in ref}
        if not within_tolerance(task, ref, once, dropped_term(task, inputs, term)):
            # the task-dtype run's own rounding (a bf16 intermediate) sets an allowance wider than the term
            return ("the eager baseline's task-dtype intermediates make the tolerance wider than it: under "
                    "tolerance: {baseline: single_rounding} (the FP32 reference rounded once) it shows")
    return ("draw the inputs that feed it where it counts (a larger std, init: {std: ...}, or a non-zero "
            "mean, init: {mean: ...}); no such redraw of a single input showed it here")


def _shifted(task: Task, spec: InputSpec, dims: dict[str, int], drawn: torch.Tensor) -> torch.Tensor:
    """An input as its init would draw it moved by one std (half its range for a uniform one), in FP32."""
    init, env = spec.init, task.init_env(dims)
    step = (expr.evaluate(init.std, env) if init.dist == "normal"
            else (expr.evaluate(init.high, env) - expr.evaluate(init.low, env)) / 2)
    return drawn.float() + step


def _widened(task: Task, spec: InputSpec, dims: dict[str, int], drawn: torch.Tensor) -> torch.Tensor:
    """An input as its init would draw it with :data:`WIDER` times its spread (the same draw, in FP32)."""
    init, env = spec.init, task.init_env(dims)
    center = (expr.evaluate(init.mean, env) if init.dist == "normal"
              else (expr.evaluate(init.low, env) + expr.evaluate(init.high, env)) / 2)
    return (drawn.float() - center) * WIDER + center


def _outputs_at_bench_shapes(task: Task) -> list[str]:
    """The reference run on meta tensors at every shape the small ones are not (the bench shapes): its
    outputs must have the declared shapes there too. A reference that reads shapes into its own
    quantities (heads from N, say) can pass at the small shapes and return another shape at a bench one,
    which only a GPU would find. A reference that cannot run on meta tensors (it reads values) is not
    checked here."""
    problems = []
    for set_name, points in task.shapes.items():
        if set_name == "small":
            continue
        for point in points:
            where = f"shape {set_name}/{point.name}"
            inputs = {spec.name: torch.empty(spec.concrete_shape(point.dims), dtype=torch_dtype(spec.dtype),
                                             device="meta") for spec in task.inputs}
            try:
                out = _run(task, inputs, fp32=False)
            except Exception as exc:  # the reference's own code: anything it raises
                if "meta" in str(exc).lower():
                    continue  # it reads values: a GPU run is the check
                problems.append(f"{where}: the reference raised {type(exc).__name__} on meta tensors of the "
                                f"declared shapes: {exc}")
                continue
            for spec in task.outputs:
                want, got = spec.concrete_shape(point.dims), out.get(spec.name)
                if isinstance(got, torch.Tensor) and tuple(got.shape) != want:
                    problems.append(f"{where}: output {spec.name!r} has shape {tuple(got.shape)}, the task "
                                    f"declares {want} (the reference, run on meta tensors)")
    return problems


def _misaligned_shapes(task: Task, row_symbols: list[frozenset[str]] | None) -> list[str]:
    """One line per tensor width that a shape (of any set) binds off TMA's row grid (the primitives'
    :func:`~coda_agent.primitives._config.tma_row_multiple`): a tensor with two dims longer than 1 and a
    task GEMM's width (its K, N or a packed 2N; its M too where ``row_symbols`` says the reference stores A
    M-major) crosses into that GEMM's kernel as tiles that TMA moves row by row, so no kernel can run the task
    at that shape. A tensor of another width (rstd per head, (M, H)) may be host work's, and is left alone."""
    # (width, bytes per element) -> field, tensors, shapes
    found: dict[tuple[str, int], tuple[Loc, list[str], list[str]]] = {}
    for set_name, points in task.shapes.items():
        for point in points:
            gemm_widths = set()
            for g, (m, n, k) in enumerate(task.gemm_shapes(point.dims)):
                gemm_widths |= {n, 2 * n, k, *([m] if row_symbols and "m" in row_symbols[g] else [])}
            for kind, tensors in (("inputs", task.inputs), ("outputs", task.outputs)):
                for i, spec in enumerate(tensors):
                    shape = spec.concrete_shape(point.dims)
                    if (
                        sum(d > 1 for d in shape) < 2
                        or shape[-1] not in gemm_widths
                        or shape[-1] % tma_row_multiple(DTYPE_BYTES[spec.dtype]) == 0
                    ):
                        continue
                    loc, names, where = found.setdefault((str(spec.shape[-1]), DTYPE_BYTES[spec.dtype]),
                                                         ((kind, i), [], []))
                    if spec.name not in names:
                        names.append(spec.name)
                    if f"{set_name}/{point.name}" not in where:
                        where.append(f"{set_name}/{point.name}")
    problems = []
    for (width, size), (loc, names, where) in found.items():
        spec = (task.outputs if loc[0] == "outputs" else task.inputs)[int(loc[1])]
        j, multiple = len(spec.shape) - 1, tma_row_multiple(size)
        first = task.shape(*where[0].split("/"))[0]
        value = spec.concrete_shape(first.dims)[-1]
        what = f"{width} is {value}" if width != str(value) else f"its width is {value}"
        also = f" (also at {', '.join(where[1:])})" if where[1:] else ""
        problems.append(
            f"{_at(task, (*loc, 'shape', j))}{_label(task, loc)}.shape[{j}]: {what} at shape "
            f"{where[0]}{also}: the rows of {', '.join(names)} are {value * size} bytes, and a kernel moves "
            f"them with TMA, which needs rows of a multiple of {TMA_ALIGN_BYTES} bytes ({multiple} "
            f"{spec.dtype} elements): the task's shape is misaligned and no kernel can run it; make {width} "
            f"a multiple of {multiple} there (as {max(multiple, round(value / multiple) * multiple)})"
        )
    return problems


def validate_path(path: Path) -> TaskReport:
    report = TaskReport(path)
    try:
        report.task = load_task(path)
    except TaskError as exc:
        # one problem a mistake, as validate_task gives them (the loader's head is the FAIL line)
        head, _, mistakes = str(exc).partition("\n")
        report.problems.extend([m.strip() for m in mistakes.splitlines()]
                               if head.endswith(": invalid task file") and mistakes else [str(exc)])
        return report
    problems, notes = _findings(report.task)
    report.problems.extend(problems)
    report.notes.extend(notes)
    return report
