"""What a call cost: list prices in USD per million input/output tokens, keyed by ``provider/model``.

The built-in table covers common Anthropic and OpenAI models at their published list prices (no
batch or cache discounts). Prices change: point ``CODA_AGENT_PRICES`` (or the ``prices=`` option of
``get_provider``) at a YAML or JSON file to add or override entries, e.g.::

    anthropic/claude-sonnet-4-5: {input: 3.0, output: 15.0}
    openai-compatible/qwen2.5-coder-32b: {input: 0, output: 0}   # my own vLLM server

A model missing from the table costs 0 with ``price_known=False``, so a run's total is never
silently wrong. Dated snapshots (``claude-sonnet-4-5-20250929``, ``gpt-4o-2024-08-06``) and
``-latest`` aliases fall back to their base model's price.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import ProviderConfigError
from .datafile import read_data_file

PRICES_ENV = "CODA_AGENT_PRICES"


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


BUILTIN_PRICES: dict[str, Price] = {
    # List prices as published mid-2026; newer models are absent (price unknown) until added here or
    # overridden. Anthropic, https://docs.anthropic.com/en/docs/about-claude/pricing
    "anthropic/claude-opus-4-7": Price(5.0, 25.0),
    "anthropic/claude-opus-4-6": Price(5.0, 25.0),
    "anthropic/claude-opus-4-5": Price(5.0, 25.0),
    "anthropic/claude-opus-4-1": Price(15.0, 75.0),
    "anthropic/claude-opus-4-0": Price(15.0, 75.0),
    "anthropic/claude-opus-4": Price(15.0, 75.0),
    "anthropic/claude-sonnet-4-6": Price(3.0, 15.0),
    "anthropic/claude-sonnet-4-5": Price(3.0, 15.0),
    "anthropic/claude-sonnet-4-0": Price(3.0, 15.0),
    "anthropic/claude-sonnet-4": Price(3.0, 15.0),
    "anthropic/claude-3-7-sonnet": Price(3.0, 15.0),
    "anthropic/claude-3-5-sonnet": Price(3.0, 15.0),
    "anthropic/claude-haiku-4-5": Price(1.0, 5.0),
    "anthropic/claude-3-5-haiku": Price(0.8, 4.0),
    "anthropic/claude-3-haiku": Price(0.25, 1.25),
    "anthropic/claude-3-opus": Price(15.0, 75.0),
    # OpenAI, https://openai.com/api/pricing
    "openai/gpt-5.5": Price(5.0, 30.0),
    "openai/gpt-5.4": Price(2.5, 15.0),
    "openai/gpt-5.4-mini": Price(0.75, 4.5),
    "openai/gpt-5.4-nano": Price(0.2, 1.25),
    "openai/gpt-5": Price(1.25, 10.0),
    "openai/gpt-5-mini": Price(0.25, 2.0),
    "openai/gpt-5-nano": Price(0.05, 0.4),
    "openai/gpt-4.1": Price(2.0, 8.0),
    "openai/gpt-4.1-mini": Price(0.4, 1.6),
    "openai/gpt-4.1-nano": Price(0.1, 0.4),
    "openai/gpt-4o": Price(2.5, 10.0),
    "openai/gpt-4o-mini": Price(0.15, 0.6),
    "openai/o1": Price(15.0, 60.0),
    "openai/o3": Price(2.0, 8.0),
    "openai/o3-mini": Price(1.1, 4.4),
    "openai/o4-mini": Price(1.1, 4.4),
}

_SNAPSHOT_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2}|latest)$")


def load_price_file(path: str | Path) -> dict[str, Price]:
    """Read an override file: a mapping of ``provider/model`` to ``{input: USD/Mtok, output: USD/Mtok}``."""
    path = Path(path)
    data: Any = read_data_file(path, "price file")
    if not isinstance(data, dict):
        raise ProviderConfigError(
            f"price file {path} must map 'provider/model' to {{input: ..., output: ...}}"
        )
    prices: dict[str, Price] = {}
    for spec, entry in data.items():
        try:
            prices[str(spec)] = Price(float(entry["input"]), float(entry["output"]))
        except (TypeError, KeyError, ValueError) as exc:
            raise ProviderConfigError(
                f"price file {path}: entry {spec!r} needs numeric 'input' and 'output' (USD per million "
                "tokens)"
            ) from exc
    return prices


def price_table(override: str | Path | None = None) -> dict[str, Price]:
    """The built-in prices, updated by ``override`` or else by the file named in ``CODA_AGENT_PRICES``."""
    table = dict(BUILTIN_PRICES)
    source = override or os.environ.get(PRICES_ENV)
    if source:
        table.update(load_price_file(source))
    return table


def find_price(model_spec: str, table: dict[str, Price] | None = None) -> Price | None:
    """The price of ``provider/model``, trying the base model of a dated snapshot; None if unknown."""
    table = price_table() if table is None else table
    spec = model_spec
    while True:
        if spec in table:
            return table[spec]
        base = _SNAPSHOT_SUFFIX.sub("", spec)
        if base == spec:
            return None
        spec = base


def cost_usd(
    model_spec: str, input_tokens: int, output_tokens: int, *, prices: dict[str, Price] | None = None
) -> float | None:
    """USD for one call to ``provider/model``, or None when its price is unknown."""
    price = find_price(model_spec, prices)
    return None if price is None else price.cost(input_tokens, output_tokens)
