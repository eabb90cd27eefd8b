"""``mock/<script>``: scripted replies for tests and demos; no network, zero cost.

A script is a YAML/JSON file holding a list of responses, or a mapping
``{responses: [...], repeat_last: true}``. Each response is one of::

    "the reply text"
    {text: "...", input_tokens: 1200, output_tokens: 300, finish_reason: end_turn}   # counts optional
    {error: rate_limit, message: "slow down"}        # raise ProviderError(kind) instead of replying

Responses are served in call order (with K concurrent candidates, in the order the calls start).
When the script runs out, the call fails with a fatal ``ProviderError(CONFIG)`` naming the script,
unless ``repeat_last`` is set, which serves the last response forever. Scripted errors are raised
as written, without the retry policy, so the agent sees exactly what the script says. Token counts
not given are estimated at four characters per token, so token budgets still bite.

``mock/echo`` replies with the last user message. In Python, ``MockProvider([...])`` takes the list
directly and ``MockProvider(fn)`` a function (sync or async) from the messages to a response.
Every call is recorded in ``provider.calls`` for tests to inspect.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..messages import ChatMessage
from .base import Completion, ErrorKind, Provider, ProviderConfigError, ProviderError
from .datafile import read_data_file

Response = str | Mapping[str, Any] | Completion
Responder = Callable[[list[ChatMessage]], Response | Awaitable[Response]]

_RESPONSE_KEYS = {"text", "input_tokens", "output_tokens", "finish_reason", "error", "message"}


@dataclass(frozen=True)
class MockCall:
    """One request the mock received."""

    messages: list[ChatMessage]
    max_tokens: int
    temperature: float


def estimate_tokens(text: str) -> int:
    """A rough count (four characters per token), for scripts that give none."""
    return math.ceil(len(text) / 4)


def _check_response(response: object, where: str) -> Response:
    if isinstance(response, (str, Completion)):
        return response
    if not isinstance(response, Mapping):
        raise ProviderConfigError(
            f"{where}: a response must be a string or a mapping, not {type(response).__name__}"
        )
    unknown = set(response) - _RESPONSE_KEYS
    if unknown:
        raise ProviderConfigError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected some of "
            f"{', '.join(sorted(_RESPONSE_KEYS))}"
        )
    if "error" in response:
        kinds = [k.value for k in ErrorKind]
        if response["error"] not in kinds:
            raise ProviderConfigError(
                f"{where}: error {response['error']!r} is not one of {', '.join(kinds)}"
            )
    elif not isinstance(response.get("text"), str):
        raise ProviderConfigError(f"{where}: a mapping response needs 'text' (a string) or 'error'")
    return response


class MockProvider(Provider):
    """Serves a script (a list of responses) or asks a function; records every call."""

    def __init__(
        self, script: Sequence[object] | Responder, *, name: str = "mock/script", repeat_last: bool = False
    ):
        self.name = name
        self.model = name.partition("/")[2] or name
        self.repeat_last = repeat_last
        self.calls: list[MockCall] = []
        self._responder: Responder | None = None
        self._responses: list[Response] = []
        self._skipped = 0
        if callable(script):
            self._responder = script
        else:
            if isinstance(script, (str, bytes)) or not isinstance(script, Sequence):
                raise ProviderConfigError(f"{name}: the script must be a list of responses")
            self._responses = [_check_response(r, f"{name} response #{i}") for i, r in enumerate(script, 1)]
            if not self._responses:
                raise ProviderConfigError(f"{name}: the script has no responses")

    @classmethod
    def from_file(
        cls, path: str | Path, *, name: str | None = None, repeat_last: bool | None = None
    ) -> MockProvider:
        """Load a YAML/JSON script; ``repeat_last`` given here wins over the file's."""
        path = Path(path)
        data: Any = read_data_file(path, "mock script")
        file_repeat = False
        if isinstance(data, Mapping):
            unknown = set(data) - {"responses", "repeat_last"}
            if unknown or "responses" not in data:
                raise ProviderConfigError(
                    f"mock script {path}: a mapping needs 'responses' (and optional 'repeat_last')"
                )
            file_repeat = bool(data.get("repeat_last", False))
            data = data["responses"]
        if not isinstance(data, list):
            raise ProviderConfigError(f"mock script {path}: expected a list of responses")
        return cls(
            data, name=name or f"mock/{path}", repeat_last=file_repeat if repeat_last is None else repeat_last
        )

    def skip_replies(self, count: int) -> None:
        """A script moves on by ``count`` responses; a function has no sequence to skip."""
        if self._responder is None:
            self._skipped += count

    async def complete(
        self, messages: list[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        self.calls.append(MockCall([m.model_copy() for m in messages], max_tokens, temperature))
        if self._responder is not None:
            response = self._responder(list(messages))
            if inspect.isawaitable(response):
                response = await response
            response = _check_response(response, f"{self.name} (function reply)")
        else:
            response = self._next_scripted()
        return self._completion(response, messages)

    def _next_scripted(self) -> Response:
        index = self._skipped + len(self.calls) - 1
        if index < len(self._responses):
            return self._responses[index]
        if self.repeat_last:
            return self._responses[-1]
        raise ProviderError(
            ErrorKind.CONFIG,
            f"{self.name} ran out of responses: call #{index + 1}, but the script has {len(self._responses)} "
            "(add responses, or set repeat_last)",
        )

    def _completion(self, response: Response, messages: list[ChatMessage]) -> Completion:
        if isinstance(response, Completion):
            return response
        if isinstance(response, str):
            response = {"text": response}
        if "error" in response:
            kind = ErrorKind(response["error"])
            raise ProviderError(
                kind, str(response.get("message") or f"{self.name}: scripted {kind.value} error")
            )
        text = response["text"]
        prompt_tokens = sum(estimate_tokens(m.content) for m in messages)
        return Completion(
            text=text,
            model=self.model,
            input_tokens=int(response.get("input_tokens", prompt_tokens)),
            output_tokens=int(response.get("output_tokens", estimate_tokens(text))),
            finish_reason=str(response.get("finish_reason", "stop")),
        )


def _echo(messages: list[ChatMessage]) -> str:
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


BUILTIN_SCRIPTS: dict[str, Responder] = {"echo": _echo}
#: Example scripts shipped with the package, addressed by file stem (``mock/gemm_residual_three_attempts``).
EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples" / "mock"


def example_scripts() -> dict[str, Path]:
    return {p.stem: p for p in sorted(EXAMPLE_DIR.glob("*.yaml"))}


def mock_from_spec(target: str, *, repeat_last: bool | None = None) -> MockProvider:
    """``mock/<file>`` loads a script file; ``mock/<name>`` a built-in responder or a shipped example
    script."""
    if target in BUILTIN_SCRIPTS:
        return MockProvider(BUILTIN_SCRIPTS[target], name=f"mock/{target}")
    path = Path(target)
    if path.is_file():
        return MockProvider.from_file(path, repeat_last=repeat_last)
    examples = example_scripts()
    if target in examples:
        return MockProvider.from_file(examples[target], name=f"mock/{target}", repeat_last=repeat_last)
    builtins = ", ".join([*BUILTIN_SCRIPTS, *examples])
    raise ProviderConfigError(f"mock/{target}: no such script file, and not a built-in mock (built-ins: "
                              f"{builtins})")
