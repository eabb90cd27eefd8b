"""Model backends, addressed as ``provider/model`` strings; ``get_provider`` is the one way in.

The registry (``registry.py``) holds every provider: its prefix, how a spec is written, a help line,
what it needs, and a factory that imports the implementation only when asked for. ``coda-agent
providers`` lists them. ``CODA_AGENT_NO_REAL_API=1`` forbids calls to real APIs except servers on
loopback addresses (``remote.py``); the retry policy is in ``retry.py``, the price table in ``prices.py``.
Providers speak :class:`coda_agent.messages.ChatMessage` and import nothing from the store, except
``replay``, which reads a recorded run through the run-directory reader.
"""

from __future__ import annotations

from .base import Completion, ErrorKind, Provider, ProviderConfigError, ProviderError, RecordedRun
from .mock import MockCall, MockProvider
from .prices import Price, cost_usd, find_price, price_table
from .registry import ProviderEntry, get_provider, lookup, provider, registered

__all__ = [
    "Completion",
    "ErrorKind",
    "MockCall",
    "MockProvider",
    "Price",
    "Provider",
    "ProviderConfigError",
    "ProviderEntry",
    "ProviderError",
    "RecordedRun",
    "cost_usd",
    "find_price",
    "get_provider",
    "lookup",
    "price_table",
    "provider",
    "registered",
]
