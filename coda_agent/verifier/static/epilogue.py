"""Rules inside an epilogue fn's body (and the module-level helpers it calls): the same fn runs on the
emulator's tensors and as the GPU's symbolic values, once per element, and must not tell them apart."""

from __future__ import annotations

import ast

from .check import Check, is_constant, number_expr
from .contract import EPILOGUE_BANNED, EPILOGUE_BUILTINS, EPILOGUE_FUNCTIONS, EPILOGUE_OPERATORS, OP_SYMBOLS


def epilogue_control_flow(node: ast.AST, check: Check) -> None:
    """No control flow on values (:data:`~.contract.EPILOGUE_BANNED`)."""
    if check.epilogue_depth:
        check.flag(node, f"{EPILOGUE_BANNED[type(node)]} are not allowed inside an epilogue fn: the GPU "
                         "traces it once for every element, on symbolic values (use maximum/minimum for "
                         "clamps and selects)")


def epilogue_reads_modules_only(node: ast.Attribute, check: Check) -> None:
    in_module = isinstance(node.value, ast.Name) and node.value.id in check.prims | check.math
    if check.epilogue_depth and not in_module:
        check.flag(node, f"{ast.unparse(node)} cannot be read inside an epilogue fn: the same fn runs on the "
                         "emulator's tensors and on the GPU's symbolic values, and may not tell them apart")


def epilogue_constant_index(node: ast.Subscript, check: Check) -> None:
    """A constant index, of a tuple a value function returned: never of a parameter, which is one value an
    element on the GPU and a tensor on the emulator (``gamma[0]`` passed there and failed to build)."""
    if not check.epilogue_depth:
        return
    if not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)):
        check.flag(node,
                   f"{ast.unparse(node)}: inside an epilogue fn only a constant index (of a tuple such as "
                         "dswiglu's) is allowed; a value is one element, not a tile")
    elif isinstance(node.value, ast.Name) and check.params and node.value.id in check.params[-1]:
        check.flag(node,
                   f"{ast.unparse(node)}: a parameter of an epilogue fn is one value per element, not a "
                         "tensor to index; only a tuple a value function returns (dswiglu's) takes a "
                         "constant index")


def epilogue_unary_signs(node: ast.UnaryOp, check: Check) -> None:
    if (
        check.epilogue_depth
        and not isinstance(node.op, (ast.USub, ast.UAdd))
        and not isinstance(node.operand, ast.Constant)
    ):
        check.flag(node, "only unary minus and plus are allowed on values inside an epilogue fn")


def epilogue_operators(node: ast.BinOp | ast.AugAssign, check: Check) -> None:
    """``+ - * /`` only: ``%``, ``//`` and ``**`` differ between the emulator and the GPU."""
    if not check.epilogue_depth or isinstance(node.op, EPILOGUE_OPERATORS):
        return
    symbol = OP_SYMBOLS.get(type(node.op), type(node.op).__name__)
    if isinstance(node, ast.AugAssign):
        check.flag(node,
                   f"the operator {symbol}= is not allowed inside an epilogue fn: + - * / work alike on the "
                         "emulator and the GPU (use the value functions for the rest)")
    elif not (isinstance(node.left, ast.Constant) and isinstance(node.right, ast.Constant)):
        check.flag(node,
                   f"the operator {symbol} is not allowed inside an epilogue fn: + - * / work alike on the "
                         "emulator and the GPU (use the value functions for the rest)")


def epilogue_calls(node: ast.Call, check: Check) -> None:
    """The primitives' value functions, the module's own helpers, and math, float and int on Python
    numbers."""
    if not check.epilogue_depth:
        return
    func = node.func
    on_numbers = all(is_constant(a)
                     or number_expr(a, check.math) for a in (*node.args, *(k.value for k in node.keywords)))
    # float and int of numbers the module fixes (a literal, math of literals, a module constant), never of a
    # value: on the GPU a value is symbolic (float() of a scalar operand passed the emulator, failed to build)
    of_constants = on_numbers or all(isinstance(a, ast.Name) and a.id in check.globals for a in node.args)
    ok = (isinstance(func, ast.Name) and (check.prim_aliases.get(func.id) in EPILOGUE_FUNCTIONS
                                          or (func.id in EPILOGUE_BUILTINS and id(func) in check.builtins
                                              and of_constants)
                                          or func.id in check.epilogue_helpers))
    ok = ok or (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and ((func.value.id in check.prims and func.attr in EPILOGUE_FUNCTIONS)
                     or (func.value.id in check.math and on_numbers)))
    if not ok:
        check.flag(node,
                   f"{ast.unparse(func)}() cannot be called inside an epilogue fn: its values are symbolic "
                         "on the GPU; call the primitives' value functions "
                         f"({', '.join(sorted(EPILOGUE_FUNCTIONS))}), your own module-level functions that "
                         "keep to the same rules, or math and float/int on Python numbers")
