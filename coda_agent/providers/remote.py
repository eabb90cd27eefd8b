"""What the SDK-backed providers share: API keys, the no-real-API switch, one retry policy, error mapping.

``CODA_AGENT_NO_REAL_API=1`` forbids every real API call: a remote provider raises
``ProviderError(DISABLED)`` before any network I/O. The one exception is a server on a loopback
address (``127.0.0.0/8``, ``::1``, ``localhost``): a local vLLM/SGLang/Ollama server, or the fake
server the tests point the real SDK clients at, stays reachable.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import time
import weakref
from abc import abstractmethod
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from ..messages import ChatMessage
from .base import Completion, ErrorKind, Provider, ProviderError
from .prices import find_price, price_table
from .retry import RetryPolicy, with_retries

NO_REAL_API_ENV = "CODA_AGENT_NO_REAL_API"


def real_api_disabled() -> bool:
    return os.environ.get(NO_REAL_API_ENV, "").strip().lower() not in ("", "0", "false", "no")


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback(url: str) -> bool:
    """True for http(s) URLs whose host is this machine (the only ones allowed under the switch)."""
    host = urlsplit(url).hostname
    return host is not None and is_loopback_host(host)


@dataclass(frozen=True)
class Reply:
    """What one SDK call returned, before pricing."""

    text: str
    model: str
    input_tokens: int
    output_tokens: int
    finish_reason: str


class RemoteProvider(Provider):
    """A model behind an HTTP API, reached through its vendor's official async SDK."""

    prefix: str  # the provider part of the spec, e.g. "anthropic"
    default_key_env: str
    base_url_env: str | None = None  # the variable the SDK itself reads when no base URL is given
    default_base_url: str = ""
    sdk: ModuleType

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        timeout: float = 600.0,
        max_retries: int = 4,
        retry_base_delay: float | None = None,
        prices: str | Path | None = None,
    ) -> None:
        self.model = model
        self.name = f"{self.prefix}/{model}"
        self.base_url = (
            base_url or (self.base_url_env and os.environ.get(self.base_url_env)) or self.default_base_url
        )
        self.timeout = timeout
        self.retry = RetryPolicy(max_retries=max_retries)
        if retry_base_delay is not None:
            self.retry.base_delay = retry_base_delay
        self.price = find_price(self.name, price_table(prices))
        self._check_allowed()
        self.key_env = api_key_env or self.default_key_env
        self.api_key = os.environ.get(self.key_env) or self._missing_key()
        self._client: Any = None
        self._client_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        # Until one call has got through, "cannot connect" means a wrong URL or a server that is not up: the
        # run stops at once. Once reached, a lost connection is a passing failure, retried like a timeout.
        self._reached = False

    def _missing_key(self) -> str:
        raise ProviderError(
            ErrorKind.AUTH, f"{self.key_env} is not set: export {self.key_env}=<your key> to use {self.name}"
        )

    def _check_allowed(self) -> None:
        if real_api_disabled() and not is_loopback(self.base_url):
            raise ProviderError(
                ErrorKind.DISABLED,
                f"{NO_REAL_API_ENV} is set: refusing to call {self.name} at {self.base_url} "
                "(only servers on a loopback address are allowed)",
            )

    @abstractmethod
    def _make_client(self) -> Any:
        """A fresh SDK client with the SDK's own retries off."""

    @abstractmethod
    async def _request(
        self, client: Any, messages: list[ChatMessage], max_tokens: int, temperature: float
    ) -> Reply:
        """One call through the SDK; SDK exceptions propagate and are mapped by the caller."""

    def _client_for_running_loop(self) -> Any:
        """The SDK client, rebuilt when the event loop changed (an httpx pool cannot outlive its loop)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is None or self._client_loop() is not loop:
            self._client = self._make_client()
            self._client_loop = weakref.ref(loop)
        return self._client

    async def complete(
        self, messages: list[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        self._check_allowed()
        client = self._client_for_running_loop()

        async def once() -> Reply:
            try:
                return await self._request(client, messages, max_tokens, temperature)
            except self.sdk.APIError as exc:
                raise self._map_error(exc) from exc
            # a body that is not UTF-8 or not JSON: the SDK lets UnicodeDecodeError through
            except ValueError as exc:
                raise ProviderError(
                    ErrorKind.OTHER,
                    f"{self.name}: the server's reply could not be read ({type(exc).__name__}: "
                    f"{_one_line(str(exc), 160)})",
                ) from exc

        reply = await with_retries(once, self.retry)
        self._reached = True
        cost = self.price.cost(reply.input_tokens, reply.output_tokens) if self.price else 0.0
        return Completion(
            text=reply.text,
            model=reply.model or self.model,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            finish_reason=reply.finish_reason,
            cost_usd=cost,
            price_known=self.price is not None,
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _not_found_hint(self) -> str:
        return "check the model name"

    def _map_error(self, exc: Exception) -> ProviderError:
        """One line per SDK failure, with the kind that tells the agent whether to retry, record or stop."""
        if isinstance(exc, self.sdk.APITimeoutError):
            return ProviderError(ErrorKind.TIMEOUT, f"{self.name}: no reply within {self.timeout:g}s")
        if isinstance(exc, self.sdk.APIConnectionError):
            if not self._reached:
                return ProviderError(
                    ErrorKind.UNREACHABLE, f"{self.name}: cannot connect to {self.base_url} ({exc}); is the "
                                           "server up and the URL right?"
                )
            return ProviderError(ErrorKind.TIMEOUT, f"{self.name}: cannot connect to {self.base_url} ({exc})")
        if not isinstance(exc, self.sdk.APIStatusError):
            return ProviderError(ErrorKind.OTHER, f"{self.name}: unexpected reply ({_one_line(str(exc))})")
        status = exc.status_code
        detail = _api_message(exc.body) or _one_line(str(exc))
        where = f"{self.name} ({status})"
        if status == 401:
            return ProviderError(
                ErrorKind.AUTH, f"{where}: the API key was rejected; set {self.key_env} to a valid key"
            )
        if status == 403:
            return ProviderError(
                ErrorKind.AUTH, f"{where}: permission denied for the key in {self.key_env}: {detail}"
            )
        if status == 402:
            return ProviderError(
                ErrorKind.AUTH, f"{where}: billing problem for the key in {self.key_env}: {detail}"
            )
        if status == 404:
            return ProviderError(
                ErrorKind.NOT_FOUND,
                f"{where}: unknown model {self.model!r} ({self._not_found_hint()}): {detail}",
            )
        if status == 408:
            return ProviderError(ErrorKind.TIMEOUT, f"{where}: request timed out: {detail}")
        retry_after = _retry_after_seconds(exc.response.headers)
        if status == 429:
            if _error_code(exc.body) == "insufficient_quota":
                return ProviderError(
                    ErrorKind.AUTH, f"{where}: quota exhausted for the key in {self.key_env}: {detail}"
                )
            return ProviderError(
                ErrorKind.RATE_LIMIT, f"{where}: rate limited: {detail}", retry_after=retry_after
            )
        if status >= 500:
            return ProviderError(
                ErrorKind.SERVER, f"{where}: server error: {detail}", retry_after=retry_after
            )
        if 400 <= status < 500:
            return ProviderError(ErrorKind.BAD_REQUEST, f"{where}: request rejected: {detail}")
        return ProviderError(ErrorKind.OTHER, f"{where}: {detail}")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_object(body: object) -> dict[str, Any]:
    """The ``error`` object of a JSON error body (OpenAI passes it unwrapped, Anthropic wrapped)."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return inner
    return {}


def _api_message(body: object) -> str:
    message = _error_object(body).get("message")
    return _one_line(message) if isinstance(message, str) else ""


def _error_code(body: object) -> str:
    error = _error_object(body)
    return str(error.get("code") or error.get("type") or "")


def _retry_after_seconds(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (a number or an HTTP date), if the server sent
    one."""
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            return float(ms) / 1000
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
