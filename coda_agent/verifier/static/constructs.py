"""The constructs refused wherever they stand (classes, ``global``, ``try``, ``with``, generators...)."""

from __future__ import annotations

import ast

from .check import Check
from .contract import BANNED_CONSTRUCTS


def banned_construct(node: ast.AST, check: Check) -> None:
    """State across calls, fallback paths, hidden control flow: :data:`~.contract.BANNED_CONSTRUCTS`."""
    check.flag(node, f"{BANNED_CONSTRUCTS[type(node)]} are not allowed in a candidate")
