"""The one Jinja environment the message templates (``templates/*.j2``) render in: plain text, strict about
names."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

TEMPLATE_DIR = Path(__file__).parent / "templates"


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR), undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, autoescape=False,
    )


def render(name: str, **data: Any) -> str:
    """One template, stripped, ending in exactly one newline."""
    return _env().get_template(name).render(**data).strip() + "\n"
