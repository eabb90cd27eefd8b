"""The one rule that reads the task: a number in the module equal to one of the task's constants is a copy of
it, where contract rule 4 asks for the argument (a kernel with ``1e-6`` written for ``eps`` passes the task it
was written for and stays wrong when the task's value changes; a manual seat's did).

Only constants no kernel writes for another reason are held to it: a value that is not a small binary
fraction (``1e-6``, ``0.1``, ``0.044715``); an integer, ``0.5`` or ``30.0`` is as likely a tile size, a
GELU's half or a bound of its own. Apart from the task-free rules (:mod:`.rules`), since those judge any
module alone.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping

from .check import Violation
from .parse import UnreadableModule, parse_module

#: A constant is held to the rule where its value times this is no integer (not a simple binary fraction).
DYADIC = 1024


def copied_constants(source: str, constants: Mapping[str, object]) -> list[Violation]:
    """A violation per number in ``source`` equal to a held task constant (``constants``: the task's)."""
    held = {name: float(v) for name, v in constants.items()
            if isinstance(v, float) and math.isfinite(v) and not float(v * DYADIC).is_integer()}
    if not held:
        return []
    try:
        tree = parse_module(source)
    except (UnreadableModule, SyntaxError):  # the task-free check says what is wrong with the text
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant):
            continue
        value = node.value
        if isinstance(value, float):
            for name, v in held.items():
                if math.isclose(value, v, rel_tol=1e-9, abs_tol=0.0):
                    found.append(Violation(node.lineno, (
                        f"{value!r} is the value of the task's constant {name}: use the argument {name} "
                        "(forward() takes every constant by name; a copy goes stale when the task's value "
                        "changes)")))
    return sorted(set(found), key=lambda v: (v.line, v.message))
