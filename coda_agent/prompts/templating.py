"""The one Jinja environment the message templates (``templates/*.j2``) render in: plain text, strict about
names."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

TEMPLATE_DIR = Path(__file__).parent / "templates"


def cell(value: object) -> str:
    """Text as one markdown table cell: a task's or a verdict's own ``|`` (``|x @ w|``) would split the row,
    a line break would end it."""
    return " ".join(str(value).split("\n")).replace("|", "\\|")


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR), undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, autoescape=False,
    )
    env.filters["cell"] = cell
    return env


def render(name: str, **data: Any) -> str:
    """One template, stripped, ending in exactly one newline."""
    return _env().get_template(name).render(**data).strip() + "\n"
