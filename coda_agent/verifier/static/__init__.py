"""The static check: an allowlist for candidate modules, checked on the AST before anything runs.

A candidate may import the public names of ``coda_agent.primitives``, ``math`` and ``torch``, and must define
``forward``. Host glue may call the torch functions in :data:`TORCH_FUNCTIONS`, the methods in
:data:`METHODS` and the builtins in :data:`BUILTINS`; everything else is refused: any other attribute chain
(``torch.serialization.os``…), a method taken as a value, dunder or private access, assignment to an
attribute anywhere or to an item of an input or a module-level name, mutable defaults, classes,
``global``/``nonlocal``, ``try``, ``with``, generators, and top-level code other than imports, functions
and constant declarations. Names resolve as Python scopes them (:func:`~.scopes.builtin_loads`): a builtin is
a builtin however the module names its parameters. Host code may not tell where it runs (``.device`` only
places new tensors; no formatting of values outside a ``raise``), so forward() on meta tensors does what it
does on a GPU. An epilogue fn's body may call only the primitives' value functions and ``math``: the same fn
runs on the emulator's tensors and as the GPU's symbolic values, and must not tell them apart. The one
decorator besides ``@epilogue(...)`` is the harness's pinned schedule on ``forward``, in exactly the form
:func:`~.schedule_form.literal_schedule` reads. The contract text of the prompt is generated from these
tables.

The modules: :mod:`.contract` (the tables), :mod:`.parse` (untrusted text to a bounded tree), :mod:`.scopes`,
:mod:`.check` (the facts and state the rules share), one module per rule family, :mod:`.rules` (the registry
of rules by node kind, and the walk) and :mod:`.schedule_form` (the ``@schedule`` form the check accepts);
:mod:`.schedule_source` sits above the check (pinning and unpinning a schedule in a module).

This is the first line, not the only one: the runner is sandboxed and the checker judges what it returns.
"""

from __future__ import annotations

from .check import Violation
from .contract import (
    BUILTINS,
    DATA_ATTRS,
    EPILOGUE_FUNCTIONS,
    METHODS,
    PRIMITIVES,
    TORCH_FUNCTIONS,
    TORCH_VALUES,
)
from .parse import MAX_DEPTH, MAX_SOURCE_CHARS, UnreadableModule, parse_module
from .rules import check_source

__all__ = [
    "BUILTINS", "DATA_ATTRS", "EPILOGUE_FUNCTIONS", "MAX_DEPTH", "MAX_SOURCE_CHARS", "METHODS", "PRIMITIVES",
    "TORCH_FUNCTIONS", "TORCH_VALUES", "UnreadableModule", "Violation", "check_source", "parse_module",
]
