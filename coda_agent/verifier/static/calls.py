"""Rules on calls in host code: builtins and methods from the allowlist, no method that changes module state,
and new tensors placed where the inputs are (a device named in the code tells the checker's meta and CPU runs
apart from the GPU's)."""

from __future__ import annotations

import ast

from .check import Check
from .contract import BUILTINS, FACTORIES, METHODS, PLACING

#: The methods that only read a module-level dict or list.
_READING_METHODS = ("get", "items", "keys", "values", "copy")


def allowed_builtin_call(node: ast.Call, check: Check) -> None:
    func = node.func
    if (
        isinstance(func, ast.Name)
        and id(func) in check.builtins
        and func.id not in BUILTINS
        and not check.message_str(func)
    ):
        check.flag(node, f"{func.id}() is not allowed in a candidate", allowlist=True)


def allowed_method(node: ast.Call, check: Check) -> None:
    func = node.func
    if isinstance(func, ast.Attribute) and not check.module_attr(func) and func.attr not in METHODS:
        check.flag(node,
                   f".{func.attr}() is not allowed (the methods host glue may call: the allowlist)",
                   allowlist=True)


def module_state_unchanged_by_methods(node: ast.Call, check: Check) -> None:
    func = node.func
    if not isinstance(func, ast.Attribute) or check.module_attr(func):
        return
    root = func.value
    if isinstance(root, ast.Name) and check.is_module_state(root.id) and func.attr not in _READING_METHODS:
        check.flag(node, f"calling .{func.attr}() on the module-level {root.id!r} is not allowed (state "
                         "across calls)")


def _names_a_device(node: ast.Call, check: Check) -> bool:
    """A device (or ``.to``'s first argument) that is not an attribute (``x.device``, ``torch.float32``) or a
    name bound only to one, or ``**`` arguments to a call that makes a tensor."""
    given = [kw.value for kw in node.keywords if kw.arg == "device"]
    placing = isinstance(node.func, (ast.Attribute, ast.Name)) and (
        node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in PLACING
    if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
        given += node.args[:1]
    return any(not (check.place_or_type(v) or (isinstance(v, ast.Name) and v.id in check.attribute_names)
                    or _torch_attribute(v, check))
               for v in given) or (placing and any(kw.arg is None for kw in node.keywords))


def _torch_attribute(node: ast.AST, check: Check) -> bool:
    """``torch.<name>``: a dtype, never a device; one off the allowlist is the names rule's to refuse."""
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in check.torch)


def no_named_device(node: ast.Call, check: Check) -> None:
    """``device="cpu"``, ``.to("meta")``: tensors go where the inputs are (``device=x.device``)."""
    if _names_a_device(node, check):
        check.flag(node, "a device may not be named in the code: put new tensors where the inputs are "
                         "(device=x.device, .to(x.device), .to(torch.float32), .to(dtype=...)); hand a "
                         "helper a tensor, not a device")


def _torch_call(node: ast.Call, check: Check) -> str | None:
    """The name of the torch function ``node`` calls, or None."""
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in check.torch:
        return func.attr
    return None


def no_tensor_constructor(node: ast.Call, check: Check) -> None:
    if _torch_call(node, check) == "Tensor" and not _names_a_device(node, check):
        check.flag(node,
                   "torch.Tensor names a type; make tensors with torch.zeros/empty/...(..., device=x.device)")


def factory_says_where(node: ast.Call, check: Check) -> None:
    """``torch.zeros(...)`` and the other factories say ``device=``: the default, the CPU, is not the inputs'
    GPU."""
    name = _torch_call(node, check)
    if (
        name in FACTORIES
        and not any(kw.arg == "device" for kw in node.keywords)
        and not _names_a_device(node, check)
    ):
        check.flag(node, f"torch.{name}() must say where the tensor goes: device=x.device (the default, the "
                         "CPU, is not where the inputs are on the GPU)")
