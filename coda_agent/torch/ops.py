"""Task kernels as ``torch.library`` custom ops: one op per (task, kernel source), its fake from the task's
YAML.

A kernel file is imported in this process the way the suite's human kernels are (``tasks.loader.import_file``)
and called directly: no sandbox. Only load kernels you trust (the human ones, or a ``best.py`` you have read).

The primitives' backend follows the tensors' device (the emulator on CPU, QuACK on a GPU); this module is
the only place that chooses it, so kernel code never does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import torch

from ..primitives import backend
from ..tasks import Task, find_task, torch_dtype
from ..tasks import expr as shape_expr
from ..tasks.loader import import_file
from . import scaled_exp

#: The tasks a Llama-3 layer stack with an LM head runs (docs/llama3-chain.md), forward then backward.
CHAIN_TASKS = (
    "gemm_rmsnorm_rope",
    "gemm_residual_rmsnorm",
    "gemm_rmsnorm_swiglu",
    "gemm_rmsnorm_cross_entropy",
    "gemm_rmsnorm_cross_entropy_bwd",
    "gemm_rmsnorm_bwd",
    "gemm_swiglu_bwd",
)

#: The tasks whose work QuACK's scaled-exp LM head does instead (``Kernels(scaled_exp_chunk=...)``); the
#: head's ``gemm_rmsnorm_bwd`` call goes too, but the layers still run that task.
SCALED_EXP_REPLACES = ("gemm_rmsnorm_cross_entropy", "gemm_rmsnorm_cross_entropy_bwd")
#: The LM head a :class:`Kernels` runs unless told otherwise: the scaled-exp one in chunks of this many rows.
#: On an H100 at 088647b it ran the Llama-3 1B step (2 and 16 layers) and the 8B layers in 0.4-1.2% less
#: non-attention time than the chain's own head, its peak at 1B 7.56 GiB against 13.74
#: (bench/results/h100-2026-12-06-i-notes.md).
SCALED_EXP_CHUNK = 4096

#: The ops registered in this process, by (task, sha256 prefix of the kernel source): a source is registered
#: once.
_registered: dict[tuple[str, str], TaskOp] = {}


def backend_for(device: torch.device) -> str:
    """The primitives backend for tensors on ``device``: QuACK's kernels on a GPU, the emulator elsewhere."""
    return "quack" if device.type == "cuda" else "torch"


def bind_dims(task: Task, inputs: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The shape symbols' values at these inputs: bare symbols first, then those seen only as ``a*X + b``.

    Sizes stay as torch gives them (symbolic under ``torch.compile(dynamic=True)``): no ``int()`` here.
    """
    dims: dict[str, Any] = {}  # ints, or SymInts while tracing
    pending: list[tuple[str, Any]] = []
    for spec in task.inputs:
        shape = inputs[spec.name].shape
        if len(shape) != len(spec.shape):
            raise ValueError(f"{task.name}: input {spec.name} has {len(shape)} dims, the task's shape is "
                             f"{spec.shape}")
        for entry, size in zip(spec.shape, shape, strict=True):
            if isinstance(entry, str) and entry.isidentifier():
                dims.setdefault(entry, size)
            elif isinstance(entry, str):
                pending.append((entry, size))
    for entry, size in pending:
        unknown = shape_expr.names(entry) - set(dims)
        if len(unknown) == 1:  # linear in its one unknown: size = a*X + b
            (name,) = unknown
            b = shape_expr.evaluate(entry, {**dims, name: 0})
            a = shape_expr.evaluate(entry, {**dims, name: 1}) - b
            dims[name] = (size - b) // a
    return dims


class TaskOp:
    """One task kernel as a custom op ``coda::<task>_<source hash>``; call it with the task's inputs by name
    and its constants, get its outputs by name."""

    def __init__(self, task: Task, source: Path, digest: str) -> None:
        self.task, self.source = task, source
        module = import_file(source, f"coda_ops_{task.name}_{digest}")
        forward = getattr(module, "forward", None)
        if not callable(forward):
            raise TypeError(f"{source}: defines no forward(**inputs) for task {task.name}")
        self.forward: Callable[..., dict[str, torch.Tensor]] = forward
        self.arg_names = [s.name for s in task.inputs] + list(task.constants)
        constants = [f"{'int' if isinstance(v, int) else 'float'} {k}" for k, v in task.constants.items()]
        returns = "Tensor" if len(task.outputs) == 1 else f"({', '.join(['Tensor'] * len(task.outputs))})"
        schema = f"({', '.join([f'Tensor {s.name}' for s in task.inputs] + constants)}) -> {returns}"
        self.op = torch.library.custom_op(f"coda::{task.name}_{digest}", self._run, mutates_args=(),
                                          schema=schema)
        self.op.register_fake(self._fake)

    def __call__(self, **kwargs: Any) -> dict[str, torch.Tensor]:
        outs = self.op(*(kwargs[name] for name in self.arg_names))
        outs = (outs,) if isinstance(outs, torch.Tensor) else outs
        return dict(zip((o.name for o in self.task.outputs), outs, strict=True))

    def output_specs(self, args: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], torch.dtype]]:
        """Each output's shape and dtype, as the task's YAML gives them at these inputs."""
        dims = bind_dims(self.task, dict(zip(self.arg_names, args, strict=False)))
        return [(tuple(shape_expr.evaluate(str(d), dims) for d in o.shape),
                 torch_dtype(o.dtype)) for o in self.task.outputs]

    def _fake(self, *args: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
        device = args[0].device
        return self._returned([torch.empty(shape, dtype=dtype,
                                           device=device) for shape, dtype in self.output_specs(args)])

    def _returned(self, outs: list[torch.Tensor]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The op's return as its schema spells it: one Tensor, or a tuple of them."""
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run(self, *args: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
        kwargs = dict(zip(self.arg_names, args, strict=True))
        for given in self.task.inputs:
            dtype = kwargs[given.name].dtype
            if dtype != torch_dtype(given.dtype):
                raise TypeError(f"{self.task.name}: input {given.name} is {dtype}, the task takes "
                                f"{given.dtype}")
        wanted = backend_for(kwargs[self.task.inputs[0].name].device)
        with nullcontext() if backend.active().name == wanted else backend.using(wanted):
            outs = self.forward(**kwargs)
        result = []
        for (shape, dtype), spec in zip(self.output_specs(args), self.task.outputs, strict=True):
            got = outs.get(spec.name)
            if got is None or tuple(got.shape) != shape or got.dtype != dtype:
                seen = "missing" if got is None else f"{tuple(got.shape)} {got.dtype}"
                raise ValueError(f"{self.source}: output {spec.name} is {seen}, the task gives {shape} "
                                 f"{dtype}")
            result.append(got)
        return self._returned(result)


def task_op(task: str | Task, source: str | Path | None = None) -> TaskOp:
    """The custom op of a task's kernel: its human kernel, or the kernel file ``source`` (e.g. a run's
    best.py)."""
    t = find_task(task) if isinstance(task, str) else task
    path = Path(source) if source is not None else t.human_file
    if path is None or not path.is_file():
        raise FileNotFoundError(f"{t.name}: no kernel file "
                                f"{'(the task has no human kernel)' if path is None else path}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    key = (t.name, digest)
    if key not in _registered:
        _registered[key] = TaskOp(t, path, digest)
    return _registered[key]


class Kernels:
    """The chain's kernels: the human ones, with any task's replaced by a kernel file of your choice.

    ``Kernels({"gemm_rmsnorm_bwd": "runs/<run>/best.py"})`` runs that file's kernel for every RMSNorm
    backward and the human kernels elsewhere. The files are imported and run in this process, unsandboxed.

    ``k_major_dgrad=True`` hands every dgrad GEMM (``dz @ w``, reducing over ``w``'s rows) a K-major copy of
    the weight, made in the backward, once per step, instead of the weight as stored (N-major). The copy is
    one memory pass over the weight; it pays where the kernel's tiles for a K-major B beat those for an
    N-major one.

    The LM head runs QuACK's scaled-exp cross-entropy (:mod:`.scaled_exp`) in chunks of ``scaled_exp_chunk``
    rows, in place of the two cross-entropy tasks and the head's ``gemm_rmsnorm_bwd``; ``None`` runs the
    chain's own head on those tasks' kernels. By default (``"default"``) the scaled-exp head takes
    :data:`SCALED_EXP_CHUNK` rows, except where a kernel file replaces a cross-entropy task (the own head runs
    it) or QuACK's pipeline does not take the head (not bf16, a vocabulary not a multiple of 128, or one whose
    chunk would pass 2^31 logits: the own head, where a chunk asked for would be refused).
    """

    def __init__(self, sources: Mapping[str, str | Path] | None = None, *, k_major_dgrad: bool = False,
                 scaled_exp_chunk: int | Literal["default"] | None = "default") -> None:
        sources = dict(sources or {})
        self._head_chosen = scaled_exp_chunk != "default"
        if scaled_exp_chunk == "default":
            scaled_exp_chunk = None if set(sources) & set(SCALED_EXP_REPLACES) else SCALED_EXP_CHUNK
        if scaled_exp_chunk is not None and (scaled_exp_chunk <= 0 or scaled_exp_chunk % 128):
            raise ValueError(f"scaled_exp_chunk must be a positive multiple of 128 rows, not "
                             f"{scaled_exp_chunk}")
        unknown = set(sources) - set(CHAIN_TASKS)
        if unknown:
            raise KeyError(f"not tasks of the Llama-3 chain: {sorted(unknown)} (the chain runs "
                           f"{', '.join(CHAIN_TASKS)})")
        unused = sorted(set(sources) & set(SCALED_EXP_REPLACES)) if scaled_exp_chunk else []
        if unused:
            raise ValueError(f"the scaled-exp LM head runs no {' or '.join(unused)}: their kernel files "
                             "would not run")
        self.ops = {name: task_op(name, sources.get(name)) for name in CHAIN_TASKS}
        self.k_major_dgrad, self.scaled_exp_chunk = k_major_dgrad, scaled_exp_chunk

    def __getitem__(self, task: str) -> TaskOp:
        return self.ops[task]

    def scaled_exp_rows(self, vocab: int, dtype: torch.dtype) -> int | None:
        """The rows per chunk of the scaled-exp LM head for a head of ``vocab`` columns in ``dtype``, or None
        for the chain's own head: a chunk asked for is always given (QuACK refuses what it cannot take), the
        default only where QuACK's pipeline takes the head."""
        if self.scaled_exp_chunk is None or self._head_chosen:
            return self.scaled_exp_chunk
        takes = (vocab % 128 == 0 and dtype == torch.bfloat16
                 and self.scaled_exp_chunk * vocab < scaled_exp.CHUNK_LOGITS_LIMIT)
        return self.scaled_exp_chunk if takes else None

    def dgrad_weight(self, w: torch.Tensor) -> torch.Tensor:
        """``w`` as the B operand of a dgrad GEMM ``dz @ w``: the same values and shape, K-major if chosen."""
        return w.t().contiguous().t() if self.k_major_dgrad else w
