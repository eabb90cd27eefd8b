"""The provider interface: every model backend turns a chat into a :class:`Completion`.

Providers are addressed as ``provider/model`` strings (``anthropic/claude-sonnet-4-5``,
``openai/gpt-4.1``, ``openai-compatible/qwen2.5-coder`` with ``--base-url``, ``mock/script.yaml``,
``replay/RUN``, ``manual``). Prompt building is not their business.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from ..messages import ChatMessage


class ErrorKind(str, Enum):
    AUTH = "auth"  # bad or missing key: stop the run
    NOT_FOUND = "not_found"  # unknown model: stop the run
    RATE_LIMIT = "rate_limit"  # retried with backoff
    SERVER = "server"  # 5xx: retried
    TIMEOUT = "timeout"  # retried
    UNREACHABLE = "unreachable"  # no connection to a server never reached yet (wrong URL, server down): stop
    BAD_REQUEST = "bad_request"  # the request itself is wrong: recorded, not retried
    DISABLED = "disabled"  # real API calls are forbidden by CODA_AGENT_NO_REAL_API
    CONFIG = "config"  # bad provider spec, missing base URL, unreadable or exhausted script: stop the run
    OTHER = "other"

    @property
    def retryable(self) -> bool:
        return self in (ErrorKind.RATE_LIMIT, ErrorKind.SERVER, ErrorKind.TIMEOUT)

    @property
    def fatal(self) -> bool:
        """Errors that no later attempt can fix: the run stops with one clear line."""
        return self in (ErrorKind.AUTH, ErrorKind.NOT_FOUND, ErrorKind.DISABLED, ErrorKind.CONFIG,
                        ErrorKind.UNREACHABLE)


class ProviderError(Exception):
    """A provider call failed; ``kind`` says whether to retry, record or stop.

    ``retry_after`` carries the server's Retry-After hint (seconds), when it sent one.
    """

    def __init__(self, kind: ErrorKind, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after = retry_after


class ProviderConfigError(ProviderError, ValueError):
    """The provider cannot be set up as asked (unknown prefix, missing base URL, bad script file)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.CONFIG, message)


@dataclass(frozen=True)
class Completion:
    """A model's reply and what it cost."""

    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    cost_usd: float = 0.0
    price_known: bool = True  # False: the model is not in the price table, so cost_usd is 0 but unknown


@dataclass(frozen=True)
class RecordedRun:
    """The recorded run a provider replays: a new run takes its task and schedule unless told otherwise."""

    spec: str  # the spec that replays this same run from anywhere (by its folder), to record and resume by
    task: str
    task_path: str
    rounds: int
    candidates_per_round: int
    task_version: int | None = None
    task_hash: str | None = None  # Task.content_hash of what its replies were written for


class Provider(ABC):
    """One model endpoint. Implementations must be safe to call concurrently (K candidates per round)."""

    name: str
    #: Set by a provider that replays a recorded run (``replay/``).
    replays: RecordedRun | None = None

    def bind_run_dir(self, run_dir: Path) -> None:  # noqa: B027 - optional hook, most providers keep no files
        """The run directory this provider serves, once it exists; a provider that trades files keeps them
        there."""

    def skip_replies(self, count: int) -> None:  # noqa: B027 - optional hook, a live model has no sequence
        """Move past the first ``count`` replies: a resumed run already consumed them. Only providers that
        serve a fixed sequence (scripts, recorded runs) have any to skip."""

    @abstractmethod
    async def complete(self, messages: list[ChatMessage], *, max_tokens: int,
                       temperature: float) -> Completion:
        """Send the chat (system message first, if any) and return the reply; raise ProviderError on
        failure."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most providers hold nothing
        """Release connections; providers without any keep the default."""
