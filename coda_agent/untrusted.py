"""Text that came from a model or a candidate: made storable, and made harmless to show.

A reply, the code in it, a candidate's exception message or stderr can hold anything: lone surrogates (which
no UTF-8 file or JSON record can hold), NUL bytes, terminal control and escape sequences (clear the screen,
move the cursor, set the clipboard through OSC 52), bidirectional overrides that make text read other than it
is. Two functions, one for each boundary:

* :func:`storable` where such text is kept (the run record's writer, the verdict's reasons, the reply as the
  loop receives it): lone surrogates become U+FFFD; everything else is kept as it came.
* :func:`shown` where it is shown or sent back (the CLI, the viewer, the feedback a model reads): every
  control character except newline and tab, every C1 control, DEL and the bidi controls become a visible
  escape (``\\x1b``, ``\\u202e``), so an escape sequence reads as text and does nothing. Markup (rich's
  ``[bold]``, HTML) is the display's own business: the CLI escapes rich markup, the viewer's templates escape
  HTML.
"""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
#: C0 but newline and tab, DEL, C1, the Arabic letter mark, LRM/RLM, line/paragraph separators, LRE..RLO,
#: LRI..PDI.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def storable(text: str) -> str:
    """``text`` as a UTF-8 file and a JSON record can hold it: each lone surrogate replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def storable_tree(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string, keys too, made
    :func:`storable`."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable_tree(k): storable_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(storable_tree(v) for v in value)
    return value


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` safe to print to a terminal, put in a page or send to a model: storable, CRLF as a newline,
    and every other control, escape or bidi character written out as a visible escape (``\\x1b``,
    ``\\u202e``)."""
    text = storable(text)
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return _CONTROL.sub(_visible, text)
