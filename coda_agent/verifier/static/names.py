"""Rules on names and attributes: builtins from the allowlist, modules only as ``module.<name>`` with names
from the contract, no private or dunder access, methods only where they are called, ``.device`` only to
place."""

from __future__ import annotations

import ast
import re

from ... import primitives
from .check import Check
from .contract import ANNOTATION_BUILTINS, BUILTINS, DATA_ATTRS, TORCH_DTYPES, TORCH_FUNCTIONS, TORCH_VALUES

#: torch's dtype names (torch.float8_e4m3fn, torch.complex64): a refused one is told the dtypes there are.
_DTYPE_NAME = re.compile(r"^(b?float|u?int|complex|bits|qu?int)\d")


def primitive_decorators_in_place(node: ast.Name | ast.Attribute, check: Check) -> None:
    """``schedule`` and ``epilogue`` only as decorators; ``Epilogue`` objects only from ``@epilogue``."""
    if check.is_primitive(node, "schedule") and id(node) not in check.schedule_decorators:
        check.flag(node, "schedule may only be used as the decorator @schedule({...}) of forward")
    if check.is_primitive(node, "epilogue") and id(node) not in check.epilogue_decorators:
        check.flag(node,
                   "epilogue may only be used as the decorator @epilogue(...) of a module-level function")
    if check.is_primitive(node, "Epilogue"):
        check.flag(node, "Epilogue objects are made with the decorator @epilogue(...), not by hand")


def no_dunder_name(node: ast.Name, check: Check) -> None:
    if node.id.startswith("__"):
        check.flag(node, f"{node.id} is not allowed")


def _module_alias(node: ast.Name, check: Check) -> bool:
    """A module's name standing for the module itself, not as the root of ``module.<name>``."""
    return node.id in check.torch | check.math | check.prims and id(node) not in check.value_roots


def modules_as_namespaces(node: ast.Name, check: Check) -> None:
    """``torch``, ``math`` and the primitives module only as ``module.<name>``: no aliases, no passing
    around."""
    if not node.id.startswith("__") and isinstance(node.ctx, ast.Load) and _module_alias(node, check):
        check.flag(node, f"{node.id} may only be used as {node.id}.<name> (no aliases or passing the module "
                         "around)")


def allowed_builtin(node: ast.Name, check: Check) -> None:
    """A builtin named (not only called) must be in :data:`~.contract.BUILTINS` (``str`` in a stop's message
    and type names in annotations aside)."""
    if node.id.startswith("__") or not isinstance(node.ctx, ast.Load) or _module_alias(node, check):
        return
    if id(node) not in check.builtins or node.id in BUILTINS or check.message_str(node):
        return
    if not (id(node) in check.annotation_names and node.id in ANNOTATION_BUILTINS):
        check.flag(node, f"the name {node.id!r} is not allowed in a candidate")


def no_private_attribute(node: ast.Attribute, check: Check) -> None:
    if node.attr.startswith("_"):
        check.flag(node, f"access to private attribute {node.attr!r} is not allowed")


def module_attribute_allowed(node: ast.Attribute, check: Check) -> None:
    """``torch.<name>`` from the contract's torch list, a torch function only called, ``P.<name>`` that
    exists."""
    if node.attr.startswith("_") or not check.module_attr(node):
        return
    assert isinstance(node.value, ast.Name)
    mod = node.value.id
    listed = node.attr in TORCH_FUNCTIONS | TORCH_VALUES
    if mod in check.torch and not listed and _DTYPE_NAME.match(node.attr):
        check.flag(node, f"torch.{node.attr} is not a dtype a candidate may use (those: "
                         f"{', '.join(sorted(TORCH_DTYPES))})")
    elif mod in check.torch and not listed:
        check.flag(node, f"torch.{node.attr} is not allowed in a candidate (the GEMM and all kernels go "
                         "through primitives; host glue's torch functions: the allowlist)", allowlist=True)
    elif mod in check.torch and node.attr in TORCH_FUNCTIONS and id(node) not in check.call_funcs:
        check.flag(node, f"torch.{node.attr} may only be called, not passed around")
    elif mod in check.prims and node.attr not in primitives.__all__:
        check.flag(node, f"primitives.{node.attr} does not exist (see the API reference)")


def methods_only_called(node: ast.Attribute, check: Check) -> None:
    """An attribute of a value is read only where it is called, data attributes aside."""
    if (not node.attr.startswith("_") and not check.module_attr(node) and id(node) not in check.call_funcs
            and node.attr not in DATA_ATTRS):
        check.flag(node, f"reading the attribute .{node.attr} is not allowed (a method must be called where "
                         f"it is named; data: {', '.join(sorted(DATA_ATTRS))})", allowlist=True)


def no_attribute_chain(node: ast.Attribute, check: Check) -> None:
    if isinstance(node.value, ast.Attribute) and check.module_attr(node.value):
        check.flag(node, f"{ast.unparse(node)}: attribute chains beyond torch.<name> are not allowed")


def device_only_places(node: ast.Attribute, check: Check) -> None:
    """``x.device`` only places a new tensor: host code must not depend on where it runs."""
    if node.attr == "device" and id(node) not in check.device_placements and not check.module_attr(node):
        check.flag(node, f"{ast.unparse(node)} may only place a new tensor (device={ast.unparse(node)}, "
                         f".to({ast.unparse(node)})): host code must not depend on where it runs")
