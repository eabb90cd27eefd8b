"""The task file format: what to compute, at which shapes, how it is checked and what "fast" means.

A task is a YAML file plus a Python FP32 reference next to it (and a human kernel). Shapes are symbolic
(``[M, K]``); named shape sets bind the symbols (``small`` for CPU checks, ``bench`` for real sizes).
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from . import expr

if TYPE_CHECKING:  # torch is imported where tensors are made: loading and listing tasks stays fast
    import torch

DType = Literal["bfloat16", "float16", "float32", "int32", "int64"]
Family = Literal["forward", "backward", "block"]
Expr = str | int | float


#: Hex digits of :attr:`Task.content_hash` kept: enough that two versions of one task never collide.
TASK_HASH_CHARS = 12

#: Bytes per element of each task dtype (the speed-of-light byte count needs no torch).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "int64": 8}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a task dtype name."""
    import torch

    return getattr(torch, name)


#: Operators whose textbook forms break at large magnitudes or near the edges of their domain: exp overflows
#: FP32 past 88, a quotient or a root blows up near 0, tanh and sigmoid written through exp turn into inf/inf,
#: and erf (an exact GELU's) has no value function: a kernel builds it from exp and a quotient.
#: A reference that calls one (or divides) gets a stress input set by default (:meth:`Task.stress_inits`).
DELICATE_OPERATORS = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "logsumexp", "softmax", "log_softmax",
    "cross_entropy", "sigmoid", "silu", "tanh", "rsqrt", "sqrt", "reciprocal", "div", "true_divide",
    "erf", "erfc", "gelu", "gelu_backward", "softplus", "logsigmoid", "mish", "elu", "selu", "celu",
})
#: The std the default stress set draws the activations at: logits of about 3 x 64 over a row, well past exp's
#: FP32 overflow at 88, while the inputs and a stable FP32 reference stay far from any range limit.
STRESS_STD = 64.0


def delicate_operators(source: str) -> list[str]:
    """The delicate operators (:data:`DELICATE_OPERATORS`, and ``/`` for a division) a Python source uses."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found.add("/")
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in DELICATE_OPERATORS:
                found.add(name)
    return sorted(found)


#: Where a field is in a task file: keys and list indices from the top, e.g. ``("inputs", 1, "shape", 0)``.
Loc = tuple[str | int, ...]


class FieldProblems(ValueError):
    """The task's own checks found these mistakes, each at the field it is about (the loader adds the line):
    one per mistake, not one per place it shows up."""

    def __init__(self, problems: list[tuple[Loc, str]]) -> None:
        super().__init__("; ".join(msg for _, msg in problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Replace(_Strict):
    """A random ``fraction`` of an input's elements set to ``value`` after drawing, so the test data holds the
    special values a task defines: cross-entropy's ``ignore_index`` among the targets, zero RoPE
    frequencies. ``rows``: whole rows (slices along the first dim) instead, the test data a norm's ``eps``
    acts at (a zero row under ``x / max(|x|, eps)``)."""

    value: Expr
    fraction: float = Field(gt=0.0, lt=1.0)
    rows: bool = False


class Init(_Strict):
    """How an input is drawn: ``normal`` (mean, std), ``uniform`` [low, high), ``randint`` [low, high) or
    ``softmax`` (logits drawn normal(mean, std), each row along the last dim softmaxed in FP32: probability
    rows that sum to 1, a teacher's distribution; the larger the std, the more peaked), optionally with a
    fraction of the elements replaced by one value (:class:`Replace`).

    Parameters may be expressions over the shape symbols and the task's constants, e.g. ``std: 1/sqrt(K)``,
    ``high: N`` or ``value: ignore_index``.
    """

    dist: Literal["normal", "uniform", "randint", "softmax"] = "normal"
    mean: Expr = 0.0
    std: Expr = 1.0
    low: Expr = 0.0
    high: Expr = 1.0
    replace: Replace | None = None


class TensorSpec(_Strict):
    """One input or output: a name, a symbolic shape and a dtype."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    shape: list[str | int]
    dtype: DType
    description: str = ""

    def concrete_shape(self, dims: dict[str, int]) -> tuple[int, ...]:
        return tuple(int(expr.evaluate(s if isinstance(s, int) else str(s), dims)) for s in self.shape)


class InputSpec(TensorSpec):
    init: Init = Init()


class ShapePoint(_Strict):
    """One binding of the shape symbols, e.g. ``{name: llama3-8b-down, dims: {M: 8192, N: 4096, K:
    14336}}``."""

    name: str
    dims: dict[str, int]
    note: str = ""

    @field_validator("dims")
    @classmethod
    def _positive(cls, v: dict[str, int]) -> dict[str, int]:
        bad = [k for k, x in v.items() if x <= 0]
        if bad:
            raise ValueError(f"dimensions must be positive: {', '.join(bad)}")
        huge = [k for k, x in v.items() if x >= MAX_DIM]
        if huge:
            raise ValueError(f"dimensions must be below 2**31 (a kernel indexes in 32 bits): "
                             f"{', '.join(huge)}")
        return v


#: Shape dimensions stay below this: the kernels index in 32 bits, and torch sizes fit 64.
MAX_DIM = 2**31
#: Integer constants stay within FP64's exact integers (init expressions read them as floats).
MAX_EXACT_INT = 2**53


def _finite_nonnegative(name: str, v: float | None) -> float | None:
    if v is not None and not (math.isfinite(v) and v >= 0):
        raise ValueError(f"tolerance {name} must be a finite number >= 0, got {v}")
    return v


class OutputTolerance(_Strict):
    factor: float | None = None
    floor: float | None = None

    @field_validator("factor", "floor")
    @classmethod
    def _sane(cls, v: float | None, info: ValidationInfo) -> float | None:
        return _finite_nonnegative(str(info.field_name), v)


#: What a candidate's error is measured against (see :class:`Tolerance`).
Baseline = Literal["eager", "single_rounding"]


class Tolerance(_Strict):
    """Per output: max|cand - ref_fp32| <= factor * max|baseline - ref_fp32| + floor * max(1, max|ref_fp32|).

    The default (factor 2, as in CODA's tests) means "no worse than twice the error of the baseline".
    ``baseline`` says which low-precision computation that is: ``eager`` (default), the reference run on the
    task-dtype inputs, rounding its intermediates as eager PyTorch does; or ``single_rounding``, CODA's: the
    FP32 reference (GEMMs accumulated in FP32) rounded once, to each output's dtype, which allows only the
    final rounding (an FP32 output gets the floor alone). NaN or Inf anywhere always fails.
    """

    factor: float = 2.0
    floor: float = 1e-5
    baseline: Baseline = "eager"
    outputs: dict[str, OutputTolerance] = {}

    @field_validator("factor", "floor")
    @classmethod
    def _sane(cls, v: float, info: ValidationInfo) -> float:
        _finite_nonnegative(str(info.field_name), v)
        return v

    def for_output(self, name: str) -> tuple[float, float]:
        o = self.outputs.get(name, OutputTolerance())
        return (o.factor if o.factor is not None else self.factor,
                o.floor if o.floor is not None else self.floor)

    def allowed(self, name: str, baseline_err: float, ref_max: float) -> float:
        """The largest max-abs error the rule lets output ``name`` have: ``factor`` times its baseline's, plus
        ``floor`` times its scale."""
        factor, floor = self.for_output(name)
        return factor * baseline_err + floor * max(1.0, ref_max)


class SpeedOfLight(_Strict):
    """Data for the speed-of-light model: FLOPs (an expression) and minimal bytes (default: every input read
    once and every output written once)."""

    flops: Expr
    bytes: Expr | None = None


def _where(loc: Loc) -> str:
    """``inputs[1]`` for a tensor's place in the task file."""
    return f"{loc[0]}[{loc[1]}]"


class Task(_Strict):
    """A target operator for the agent and the verifier."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    version: int = Field(ge=1)
    family: Family
    description: str
    conventions: str = ""
    inputs: list[InputSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    constants: dict[str, float | int] = {}
    shapes: dict[str, list[ShapePoint]]
    reference: str = Field(description="'file.py:function', relative to the YAML file")
    human: str | None = Field(default=None,
                              description="path of the hand-written candidate, relative to the YAML")
    tolerance: Tolerance = Tolerance()
    launch_budget: int = Field(ge=1, description="max kernel launches in one forward call")
    sol: SpeedOfLight
    stress: dict[str, Init] | None = Field(
        default=None,
        description="the stress input set: inits that replace some inputs' (large magnitudes, ties, values "
                    "near a "
        "domain's edge) in one more input set the correctness check runs; {} for none; left out, a default "
        "when the reference is numerically delicate (Task.stress_inits)",
    )
    gemms: list[list[Expr]] = Field(
        default=[],
        description="the GEMMs the task contains, [M, N, K] each; the bench times them alone through cuBLAS "
                    "as the "
        "practical floor, each in the layout the reference multiplies it in (measure.baselines.gemm_layouts)",
    )
    _path: Path | None = PrivateAttr(default=None)

    @field_validator("reference")
    @classmethod
    def _ref_form(cls, v: str) -> str:
        if ":" not in v or not v.split(":", 1)[0].endswith(".py"):
            raise ValueError("must look like 'file.py:function'")
        return v

    @field_validator("shapes")
    @classmethod
    def _need_sets(cls, v: dict[str, list[ShapePoint]]) -> dict[str, list[ShapePoint]]:
        for required in ("small", "bench"):
            if not v.get(required):
                raise ValueError(f"needs a non-empty '{required}' shape set")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Task:
        problems: list[tuple[Loc, str]] = []
        tensors: list[tuple[Loc, TensorSpec]] = [(("inputs", i), t) for i, t in enumerate(self.inputs)]
        tensors += [(("outputs", i), t) for i, t in enumerate(self.outputs)]
        first: dict[str, Loc] = {}
        for loc, t in tensors:
            if t.name in first:
                problems.append(((*loc, "name"), f"{t.name!r} is also {_where(first[t.name])}: input/output "
                                                 "names must be unique"))
            first.setdefault(t.name, loc)
        bound = {d for points in self.shapes.values() for p in points for d in p.dims}
        for c in self.constants:
            if c in first:
                problems.append((("constants", c), f"constant {c} has the name of an input or output"))
            if c in bound:
                problems.append((("constants", c), f"constant {c} has the name of a shape symbol"))
            value = self.constants[c]
            if isinstance(value, int) and abs(value) > MAX_EXACT_INT:
                problems.append((("constants", c), f"constant {c} is beyond 2**53 (an init reads it as a "
                                                   "float, which would not hold it)"))
        uses: dict[str, Loc] = {}  # each shape symbol, and where it is first used

        def use(loc: Loc, e: Expr) -> None:
            try:
                found = expr.names(str(e))
            except expr.ExprError as exc:
                problems.append((loc, str(exc)))
                return
            for s in sorted(found):
                uses.setdefault(s, loc)

        for loc, t in tensors:
            for j, dim in enumerate(t.shape):
                if isinstance(dim, str):
                    use((*loc, "shape", j), dim)
        use(("sol", "flops"), self.sol.flops)
        for g, gemm in enumerate(self.gemms):
            if len(gemm) != 3:
                problems.append((("gemms", g), f"each entry must be [M, N, K], got {gemm}"))
                continue
            for d, size in enumerate(gemm):
                use(("gemms", g, d), size)
        for symbol, loc in uses.items():
            unbound = [f"{set_name}/{p.name}" for set_name, points in self.shapes.items() for p in points
                       if symbol not in p.dims]
            if len(unbound) == sum(len(points) for points in self.shapes.values()):
                problems.append((loc, (
                    f"uses {symbol}, a constant: shapes, gemms and sol read shape symbols only; bind "
                    f"{symbol} in each shape's dims instead ({symbol}: {self.constants[symbol]})"
                    if symbol in self.constants else
                    f"uses {symbol}, which no shape binds: no shape's dims have it (a typo?)")))
            elif unbound:
                which = f"shape {unbound[0]} does" if len(unbound) == 1 else f"shapes {', '.join(unbound)} do"
                problems.append((loc, f"uses {symbol}, which {which} not bind"))
        inputs = [i.name for i in self.inputs]
        for name in self.stress or {}:
            if name not in inputs:
                problems.append((("stress", name),
                                 f"names {name!r}, which is not an input (inputs: {', '.join(inputs)})"))
        if self.launch_budget < len(self.gemms):  # each listed GEMM is a gemm() call: a launch at least
            problems.append((("launch_budget",), f"{self.launch_budget} is below the {len(self.gemms)} GEMMs "
                             "the task lists, each a gemm() call of its own (a launch at least): no kernel "
                             "fits it"))
        outputs = [o.name for o in self.outputs]
        for name in self.tolerance.outputs:
            if name not in outputs:
                problems.append((("tolerance", "outputs", name),
                                 f"names {name!r}, which is not an output (outputs: {', '.join(outputs)})"))
        if not problems:  # expressions are evaluated only once they parse and every symbol is bound
            failed: dict[Loc, str] = {}
            for set_name, points in self.shapes.items():
                for p in points:
                    for loc, msg in self._check_expressions(f"shape {set_name}/{p.name}", p.dims):
                        failed.setdefault(loc, msg)  # the first shape where an expression fails says it
            problems += failed.items()
        if problems:
            raise FieldProblems(problems)
        return self

    def _check_expressions(self, where: str, dims: dict[str, int]) -> list[tuple[Loc, str]]:
        """What does not evaluate at this shape point (so no command meets a bad expression halfway through a
        run)."""
        env = {k: float(v) for k, v in dims.items()}
        problems: list[tuple[Loc, str]] = []

        def value(loc: Loc, e: Expr, kind: str = "number", env: dict[str, float] = env) -> None:
            try:
                v = expr.evaluate(e, env)
            except (expr.ExprError, ArithmeticError, ValueError, TypeError) as exc:
                problems.append((loc, f"{e!r} at {where}: {exc}"))
                return
            if not math.isfinite(v):
                problems.append((loc, f"{e!r} is {v} at {where}"))
            elif kind == "size" and (v != int(v) or v < 1):
                problems.append((loc, f"{e!r} is {v:g} at {where}, not a positive whole number"))

        for kind, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            for i, t in enumerate(tensors):
                for j, dim in enumerate(t.shape):
                    value((kind, i, "shape", j), dim, "size")
        init_env = self.init_env(dims)
        inits: list[tuple[Loc, Init]] = [(("inputs", i, "init"),
                                          spec.init) for i, spec in enumerate(self.inputs)]
        inits += [(("stress", name), ini) for name, ini in (self.stress or {}).items()]
        for loc, ini in inits:
            for param in ["mean", "std"] if ini.dist in ("normal", "softmax") else ["low", "high"]:
                value((*loc, param), getattr(ini, param), env=init_env)
            if ini.replace is not None:
                value((*loc, "replace", "value"), ini.replace.value, env=init_env)
        value(("sol", "flops"), self.sol.flops)
        if self.sol.bytes is not None:
            value(("sol", "bytes"), self.sol.bytes)
        for g, gemm in enumerate(self.gemms):
            for d, size in enumerate(gemm):
                value(("gemms", g, d), size, "size")
        return problems

    def init_env(self, dims: dict[str, int]) -> dict[str, float]:
        """What ``init`` expressions may read: the shape symbols and the task's constants."""
        return {**{k: float(v) for k, v in self.constants.items()}, **{k: float(v) for k, v in dims.items()}}

    # --- derived facts -------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        if self._path is None:
            raise RuntimeError(f"task {self.name} was not loaded from a file")
        return self._path

    def bind_path(self, path: Path) -> Task:
        self._path = path
        return self

    @property
    def reference_file(self) -> Path:
        return self.path.parent / self.reference.split(":", 1)[0]

    @property
    def reference_function(self) -> str:
        return self.reference.split(":", 1)[1]

    @property
    def human_file(self) -> Path | None:
        return self.path.parent / self.human if self.human else None

    @property
    def content_hash(self) -> str:
        """A short hash of what defines the operator: the task's fields as loaded (a comment or a reformatting
        is no other task) and its reference's text; not its ``human:`` kernel, one author's answer. A task's
        identity, so two different tasks under one name are never ranked together."""
        fields = json.dumps(self.model_dump(mode="json", exclude={"human"}), sort_keys=True).encode()
        reference = self.reference_file.read_bytes() if self.reference_file.is_file() else b""
        digest = hashlib.sha256(len(fields).to_bytes(8, "little") + fields + reference)
        return digest.hexdigest()[:TASK_HASH_CHARS]

    def shape(self, set_name: str, name: str | None = None) -> list[ShapePoint]:
        """The shape points of a set (or the one named ``name``)."""
        if set_name not in self.shapes:
            raise KeyError(f"task {self.name} has no shape set {set_name!r} (has: {', '.join(self.shapes)})")
        points = self.shapes[set_name]
        if name is None:
            return points
        found = [p for p in points if p.name == name]
        if not found:
            raise KeyError(f"task {self.name} has no shape {name!r} in {set_name!r}")
        return found

    def points(self, set_name: str, names: Sequence[str] | None = None) -> list[ShapePoint]:
        """The shape points of a set, narrowed to ``names`` when given (a plan's, a bench's selection)."""
        points = self.shape(set_name)
        return [p for p in points if p.name in names] if names else points

    def output_shapes(self, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
        return {o.name: o.concrete_shape(dims) for o in self.outputs}

    def output_bytes(self, dims: dict[str, int]) -> int:
        """What one call's outputs take at their declared dtypes."""
        return sum(math.prod(o.concrete_shape(dims)) * DTYPE_BYTES[o.dtype] for o in self.outputs)

    def input_bytes(self, dims: dict[str, int]) -> int:
        """What one input set takes at the declared dtypes."""
        return sum(math.prod(i.concrete_shape(dims)) * DTYPE_BYTES[i.dtype] for i in self.inputs)

    def flops(self, dims: dict[str, int]) -> float:
        return float(expr.evaluate(self.sol.flops, dims))

    def min_bytes(self, dims: dict[str, int]) -> float:
        """Minimal HBM traffic: the SoL model's byte count."""
        if self.sol.bytes is not None:
            return float(expr.evaluate(self.sol.bytes, dims))
        total = 0
        for t in (*self.inputs, *self.outputs):
            total += math.prod(t.concrete_shape(dims)) * DTYPE_BYTES[t.dtype]
        return float(total)

    def gemm_shapes(self, dims: dict[str, int]) -> list[tuple[int, int, int]]:
        """The task's GEMMs as concrete (M, N, K) at one shape point."""
        env = {k: float(v) for k, v in dims.items()}
        return [(int(expr.evaluate(m, env)), int(expr.evaluate(n, env)),
                 int(expr.evaluate(k, env))) for m, n, k in self.gemms]

    def stress_inits(self) -> dict[str, Init]:
        """The inits the stress input set draws in place of the task's own; empty: the task has no stress set.

        The task's ``stress`` block when it has one; otherwise, when its reference calls a delicate operator
        (:func:`delicate_operators`), every floating input left at the default init (a standard normal: the
        activations, whose values the task leaves open) drawn at std :data:`STRESS_STD`. Inputs with an init
        of their own (weights at 1/sqrt(K), a range such as rstd's, integer ids) keep it: the task says their
        values lie there. A task not loaded from a file has no reference source to read, so only its own
        block."""
        if self.stress is not None:
            return self.stress
        if self._path is None or not delicate_operators(self.reference_file.read_text()):
            return {}
        return {s.name: Init(std=STRESS_STD) for s in self.inputs if s.init == Init()
                and s.dtype.startswith(("bfloat", "float"))}

    def make_inputs(self, dims: dict[str, int], seed: int, device: str | torch.device = "cpu",
                    stress: bool = False) -> dict[str, torch.Tensor]:
        """Fresh random inputs for one shape point and seed (drawn in FP32, then cast); ``stress``: the stress
        set's (:meth:`stress_inits`)."""
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        out: dict[str, torch.Tensor] = {}
        env = self.init_env(dims)
        overrides = self.stress_inits() if stress else {}
        for spec in self.inputs:
            shape = spec.concrete_shape(dims)
            dt = torch_dtype(spec.dtype)
            ini = overrides.get(spec.name, spec.init)
            if ini.dist == "randint":
                ilo, ihi = int(expr.evaluate(ini.low, env)), int(expr.evaluate(ini.high, env))
                t = torch.randint(ilo, ihi, shape, generator=gen, device=device, dtype=dt)
            elif ini.dist in ("normal", "softmax"):
                t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
                t = t * expr.evaluate(ini.std, env) + expr.evaluate(ini.mean, env)
                t = (t.softmax(dim=-1) if ini.dist == "softmax" else t).to(dt)
            else:
                lo, hi = expr.evaluate(ini.low, env), expr.evaluate(ini.high, env)
                t = (torch.rand(shape, generator=gen, device=device,
                                dtype=torch.float32) * (hi - lo) + lo).to(dt)
            if ini.replace is not None:
                drawn = (shape[:1] + (1,) * (len(shape) - 1)) if ini.replace.rows and shape else shape
                chosen = torch.rand(drawn, generator=gen, device=device) < ini.replace.fraction
                chosen = chosen.expand(shape)
                t = t.masked_fill(chosen, expr.evaluate(ini.replace.value, env))
            out[spec.name] = t
        return out

    def summary_shapes(self, set_name: str) -> str:
        return ", ".join(
            f"{p.name}(" + ",".join(f"{k}={v}" for k, v in p.dims.items())
            + ")" for p in self.shapes.get(set_name, [])
        )

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly view for prompts and records."""
        return self.model_dump(mode="json")
