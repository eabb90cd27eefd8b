"""Model backends, addressed as ``provider/model`` strings; ``get_provider`` is the one way in.

- ``anthropic/<model>``: Anthropic messages API (key in ``ANTHROPIC_API_KEY``)
- ``openai/<model>``: OpenAI chat completions (key in ``OPENAI_API_KEY``)
- ``openai-compatible/<model>``: any OpenAI-style server at ``base_url`` (key in ``OPENAI_COMPATIBLE_API_KEY``)
- ``mock/<script-file-or-name>``: scripted replies (``mock.py``)
- ``replay/<run-dir>``: a stored run's replies, in order (``replay.py``)
- ``manual`` or ``manual/<dir>``: prompts to files, answers from files (``manual.py``)

``CODA_AGENT_NO_REAL_API=1`` forbids calls to real APIs except servers on loopback addresses
(``remote.py``); the retry policy is in ``retry.py``, the price table in ``prices.py``.
"""

from __future__ import annotations

from typing import Any

from .base import Completion, ErrorKind, Provider, ProviderConfigError, ProviderError
from .manual import ManualProvider
from .mock import MockCall, MockProvider, mock_from_spec
from .prices import Price, cost_usd, find_price, price_table
from .replay import ReplayProvider

KNOWN_PROVIDERS = {
    "anthropic": "anthropic/<model>",
    "openai": "openai/<model>",
    "openai-compatible": "openai-compatible/<model> with a base URL",
    "mock": "mock/<script.yaml|echo>",
    "replay": "replay/<run-dir>",
    "manual": "manual[/<dir>]",
}

_REMOTE_OPTIONS = {"timeout", "max_retries", "retry_base_delay", "prices"}
_OPTIONS = {
    "anthropic": _REMOTE_OPTIONS,
    "openai": _REMOTE_OPTIONS,
    "openai-compatible": _REMOTE_OPTIONS,
    "mock": {"repeat_last"},
    "replay": set(),
    "manual": {"directory", "timeout", "poll_interval", "notify"},
}


def get_provider(
    spec: str, *, base_url: str | None = None, api_key_env: str | None = None, **options: Any
) -> Provider:
    """Build the provider named by ``spec`` (``provider/model``).

    Options set to None are ignored, so a CLI can pass its flags through unconditionally. Raises
    ProviderConfigError (also a ValueError) for a bad spec or option, and ProviderError(AUTH or
    DISABLED) when a real API's key is missing or real calls are switched off: both fatal, one line.
    """
    prefix, _, target = spec.partition("/")
    if prefix not in KNOWN_PROVIDERS:
        known = ", ".join(KNOWN_PROVIDERS.values())
        raise ProviderConfigError(f"unknown provider {spec!r}: expected one of {known}")
    if not target and prefix != "manual":
        raise ProviderConfigError(f"{spec!r} names no model: expected {KNOWN_PROVIDERS[prefix]}")
    options = {k: v for k, v in options.items() if v is not None}
    unknown = set(options) - _OPTIONS[prefix]
    if unknown:
        allowed = ", ".join(sorted(_OPTIONS[prefix])) or "none"
        raise ProviderConfigError(
            f"{prefix}: unknown option(s) {', '.join(sorted(unknown))} (allowed: {allowed})"
        )
    if prefix in ("anthropic", "openai", "openai-compatible"):
        return _remote(prefix, target, base_url=base_url, api_key_env=api_key_env, **options)
    if base_url is not None or api_key_env is not None:
        raise ProviderConfigError(f"{prefix} calls no API: base_url and api_key_env do not apply")
    if prefix == "mock":
        return mock_from_spec(target, **options)
    if prefix == "replay":
        return ReplayProvider(target)
    if target:
        options.setdefault("directory", target)
    return ManualProvider(**options)


def _remote(prefix: str, model: str, **options: Any) -> Provider:
    """Import an SDK only when its provider is asked for."""
    if prefix == "anthropic":
        from .anthropic_api import AnthropicProvider

        return AnthropicProvider(model, **options)
    from .openai_api import OpenAICompatibleProvider, OpenAIProvider

    cls = OpenAIProvider if prefix == "openai" else OpenAICompatibleProvider
    return cls(model, **options)


__all__ = [
    "KNOWN_PROVIDERS",
    "Completion",
    "ErrorKind",
    "ManualProvider",
    "MockCall",
    "MockProvider",
    "Price",
    "Provider",
    "ProviderConfigError",
    "ProviderError",
    "ReplayProvider",
    "cost_usd",
    "find_price",
    "get_provider",
    "price_table",
]
