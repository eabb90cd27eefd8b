"""Getting the candidate module out of a model's reply, whatever shape the reply takes.

Models wrap code in fenced blocks (```python, ```py, bare ```, sometimes ~~~), add prose, think aloud
in ``<think>`` sections, show snippets before the final file, or answer with the bare file. The rule:
among the Python-looking fenced blocks, take the last complete module (one that defines ``forward`` and
parses); failing that, the last one that defines ``forward`` (so the model hears about its syntax error);
failing that, the largest block; with no fence at all, the whole reply if it parses as a module. Any text is
safe here: a reply too long to search, or a block Python's parser chokes on (deep nesting, NUL bytes), is an
extraction error or a block that does not parse, never an exception. And any text takes time linear in its
length: each search for a fence starts where the last block ended and backtracks over no more than the line it
tries (one pattern over the whole reply, as before issue 46, backtracked quadratically on an unclosed fence
followed by backticks: 15 s for 160,000 of them, most of an hour at the cap), and the blocks are parsed from
the last one back until one parses, each at most once.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from ..prompts.chat import strip_thinking
from ..verifier.static import parse_module

#: A line that opens a fenced block: the fence (three or more backticks or tildes), then the language tag.
_OPENER = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+.-]*)", re.MULTILINE)
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


def fenced_blocks(text: str) -> Iterator[tuple[str, str]]:
    """The (language tag, body) of each fenced block of ``text``, in order.

    A block opens on a line that starts with a fence and has a newline after it, and closes at the first later
    line that holds the same fence alone (spaces and tabs around it); one never closed runs to the end of the
    text. Each search starts where the last one stopped, and neither pattern backtracks past the line it
    tries: the time is linear in the length of the text, whatever it holds.
    """
    pos = 0
    while (opener := _OPENER.search(text, pos)) is not None:
        eol = text.find("\n", opener.end())
        if eol < 0:
            return  # the last line, which opens nothing
        closing = _closing(opener["fence"]).search(text, eol + 1)
        if closing is None:
            yield opener["lang"], text[eol + 1:]
            return
        yield opener["lang"], text[eol + 1:closing.start()]
        pos = closing.end() + 1


@functools.lru_cache(maxsize=64)
def _closing(fence: str) -> re.Pattern[str]:
    """A line that holds ``fence`` alone (the same character, as many times), spaces and tabs around it."""
    return re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)}}}[ \t]*$", re.MULTILINE)


def extract_code(reply: str) -> Extraction:
    """The candidate module in ``reply``, or why there is none."""
    if len(reply) > MAX_REPLY_CHARS:
        return Extraction(None, f"the reply is {len(reply):,} characters long; replies over "
                                f"{MAX_REPLY_CHARS:,} are not searched for code: answer with the module "
                                "alone, in one ```python block")
    text = strip_thinking(reply)
    blocks = [body.strip("\n") for lang, body in fenced_blocks(text) if lang.lower() in _PYTHON_TAGS]
    blocks = [b for b in blocks if b.strip()]
    if blocks:
        with_forward = [b for b in blocks if _FORWARD.search(b)]
        # from the end: the last one wins
        complete = next((b for b in reversed(with_forward) if _parses(b)), None)
        if complete is not None:
            return Extraction(complete.rstrip() + "\n")
        if with_forward:
            return Extraction(with_forward[-1].rstrip() + "\n")
        return Extraction(max(blocks, key=len).rstrip() + "\n")
    bare = text.strip()
    if bare and _parses(bare):
        return Extraction(bare + "\n")
    if not reply.strip():
        return Extraction(None, "the reply was empty")
    return Extraction(None, "the reply held no ```python block and is not itself a Python module")
