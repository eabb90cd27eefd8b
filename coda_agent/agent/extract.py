"""Getting the candidate module out of a model's reply, whatever shape the reply takes.

Models wrap code in fenced blocks (```python, ```py, bare ```, sometimes ~~~), add prose, think aloud
in ``<think>`` sections, show snippets before the final file, or answer with the bare file. The rule:
among the Python-looking fenced blocks, take the last complete module (one that defines ``forward`` and
parses); failing that, the last one that defines ``forward`` (so the model hears about its syntax error);
failing that, the largest block; with no fence at all, the whole reply if it parses as a module. Any text is
safe here: a reply too long to search, or a block Python's parser chokes on (deep nesting, NUL bytes), is an
extraction error or a block that does not parse, never an exception.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ..prompts.chat import strip_thinking
from ..verifier.static import parse_module

_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<body>.*?)(?:^[ \t]*(?P=fence)[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_FORWARD = re.compile(r"^def\s+forward\s*\(", re.MULTILINE)
#: The longest reply searched for code (a reply within any model's output limit is a small fraction of this).
MAX_REPLY_CHARS = 2_000_000


@dataclass(frozen=True)
class Extraction:
    code: str | None
    error: str | None = None


def _parses(code: str) -> bool:
    try:
        tree = parse_module(code)
    except SyntaxError:  # a syntax error, or text no check should walk (static.UnreadableModule)
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom)) for n in tree.body)


def extract_code(reply: str) -> Extraction:
    """The candidate module in ``reply``, or why there is none."""
    if len(reply) > MAX_REPLY_CHARS:
        return Extraction(None, f"the reply is {len(reply):,} characters long; replies over {MAX_REPLY_CHARS:,} are not "
                                "searched for code: answer with the module alone, in one ```python block")
    text = strip_thinking(reply)
    blocks = [m.group("body").strip("\n") for m in _FENCE.finditer(text) if m.group("lang").lower() in _PYTHON_TAGS]
    blocks = [b for b in blocks if b.strip()]
    if blocks:
        with_forward = [b for b in blocks if _FORWARD.search(b)]
        complete = [b for b in with_forward if _parses(b)]
        if complete:
            return Extraction(complete[-1].rstrip() + "\n")
        if with_forward:
            return Extraction(with_forward[-1].rstrip() + "\n")
        return Extraction(max(blocks, key=len).rstrip() + "\n")
    bare = text.strip()
    if bare and _parses(bare):
        return Extraction(bare + "\n")
    if not reply.strip():
        return Extraction(None, "the reply was empty")
    return Extraction(None, "the reply held no ```python block and is not itself a Python module")
