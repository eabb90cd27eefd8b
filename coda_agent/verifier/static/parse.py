"""Reading untrusted text into a syntax tree, with the bounds every walk over it relies on."""

from __future__ import annotations

import ast

#: The longest module the static check reads (a kernel is a few kB; a reply the size of a book is not one).
MAX_SOURCE_CHARS = 500_000
#: The deepest a module's syntax tree may nest. A kernel stays under 20 levels; Python's own recursive tools
#: (``ast.unparse``, the compiler, a ``NodeVisitor``) give up near 1000, so a 1,200-term sum must stop here.
MAX_DEPTH = 100


class UnreadableModule(SyntaxError):
    """Source the static check does not read: too large, nested too deeply, NUL bytes, or beyond Python's
    parser (which raises RecursionError or MemoryError on such text, not SyntaxError). ``msg`` says which."""


def nesting_depth(tree: ast.AST) -> tuple[int, int]:
    """The depth of ``tree``'s deepest node and its line, found without recursion (so any depth is
    measured)."""
    deepest, line = 0, 0
    stack: list[tuple[ast.AST, int, int]] = [(tree, 1, 0)]
    while stack:
        node, depth, at = stack.pop()
        at = getattr(node, "lineno", at)
        if depth > deepest:
            deepest, line = depth, at
        stack.extend((child, depth + 1, at) for child in ast.iter_child_nodes(node))
    return deepest, line


def parse_module(source: str) -> ast.Module:
    """The syntax tree of untrusted ``source``. Raises SyntaxError for a syntax error and
    :class:`UnreadableModule` (a SyntaxError too) for text no check should walk: every caller that catches
    SyntaxError is safe from it."""
    if len(source) > MAX_SOURCE_CHARS:
        raise UnreadableModule(f"the module is {len(source):,} characters long; at most {MAX_SOURCE_CHARS:,} "
                               "are read")
    try:
        tree = ast.parse(source)
    except (RecursionError, MemoryError):
        raise UnreadableModule(
            "expression nested too deeply for Python's parser: split long sums and chains into named parts"
        ) from None
    except ValueError as exc:  # NUL bytes (Python 3.11 raises ValueError; 3.12 a SyntaxError)
        raise UnreadableModule(f"the module cannot be parsed: {exc}") from None
    depth, line = nesting_depth(tree)
    if depth > MAX_DEPTH:
        err = UnreadableModule(
            f"expression nested too deeply ({depth} levels, at most {MAX_DEPTH}): split long sums and chains "
            "into named parts"
        )
        err.lineno = line
        raise err
    return tree
