"""The one retry policy for remote providers: exponential backoff with jitter, honouring Retry-After.

The SDKs' own retries are switched off (``max_retries=0``) so this is the only place that decides.
Only retryable kinds (rate limit, 5xx, timeouts and connection errors) are retried, a bounded
number of times. ``CODA_AGENT_RETRY_BASE_DELAY=0`` (or ``retry_base_delay=0``) turns all waiting
off, Retry-After included, so tests retry instantly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .base import ProviderError

log = logging.getLogger("coda_agent.providers")

RETRY_DELAY_ENV = "CODA_AGENT_RETRY_BASE_DELAY"

T = TypeVar("T")


def _default_base_delay() -> float:
    return float(os.environ.get(RETRY_DELAY_ENV, "1.0"))


@dataclass
class RetryPolicy:
    """``max_retries`` extra tries after the first; delays double from ``base_delay`` up to ``max_delay``."""

    max_retries: int = 4
    base_delay: float = field(default_factory=_default_base_delay)
    max_delay: float = 60.0
    max_retry_after: float = 300.0  # a server asking for longer than this is not waited for beyond it
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based): the server's hint, else jittered
        backoff."""
        if self.base_delay <= 0:
            return 0.0
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        ceiling = min(self.max_delay, self.base_delay * 2**retry)
        return ceiling / 2 + random.uniform(0, ceiling / 2)


async def with_retries(call: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """Await ``call()``; on a retryable ProviderError wait and try again, up to ``policy.max_retries``
    times."""
    retry = 0
    while True:
        try:
            return await call()
        except ProviderError as exc:
            if not exc.kind.retryable:
                raise
            if retry == policy.max_retries:
                raise ProviderError(exc.kind, f"{exc} (gave up after {retry + 1} tries)") from exc
            wait = policy.delay(retry, exc.retry_after)
            retry += 1
            log.warning("%s; retry %d/%d in %.1fs", exc, retry, policy.max_retries, wait)
            await policy.sleep(wait)
