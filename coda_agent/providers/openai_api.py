"""``openai/<model>`` and ``openai-compatible/<model>``: chat completions through the official async SDK.

``openai-compatible`` serves any server speaking the OpenAI chat-completions API (vLLM, SGLang,
Ollama, llama.cpp, hosted gateways): ``base_url`` is required (usually ending in ``/v1``), the key
comes from ``OPENAI_COMPATIBLE_API_KEY`` (or the variable named by ``api_key_env``), and when the
default variable is unset a dummy key is sent, which is all a keyless local server needs.
"""

from __future__ import annotations

import re
from typing import Any

import openai

from ..messages import ChatMessage
from .base import ErrorKind, ProviderConfigError, ProviderError
from .remote import RemoteProvider, Reply

# OpenAI's reasoning models reject any temperature but the default: leave it out for them.
_REASONING_MODEL = re.compile(r"^(o\d|gpt-[5-9])")


class OpenAIProvider(RemoteProvider):
    prefix = "openai"
    default_key_env = "OPENAI_API_KEY"
    base_url_env: str | None = "OPENAI_BASE_URL"
    default_base_url = "https://api.openai.com/v1"
    sdk = openai

    def _make_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key=self.api_key, base_url=self.base_url, timeout=self.timeout, max_retries=0
        )

    def _request_options(self, max_tokens: int, temperature: float) -> dict[str, Any]:
        if _REASONING_MODEL.match(self.model):
            return {"max_completion_tokens": max_tokens}
        return {"max_completion_tokens": max_tokens, "temperature": temperature}

    async def _request(
        self, client: Any, messages: list[ChatMessage], max_tokens: int, temperature: float
    ) -> Reply:
        response = await client.chat.completions.create(
            model=self.model,
            messages=[{"role": m.role, "content": m.content} for m in messages],
            **self._request_options(max_tokens, temperature),
        )
        if not response.choices:
            raise ProviderError(ErrorKind.SERVER, f"{self.name}: the reply has no choices")
        choice = response.choices[0]
        usage = response.usage
        return Reply(
            text=choice.message.content or "",
            model=response.model or self.model,
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
            finish_reason=choice.finish_reason or "",
        )


class OpenAICompatibleProvider(OpenAIProvider):
    prefix = "openai-compatible"
    default_key_env = "OPENAI_COMPATIBLE_API_KEY"
    base_url_env = None
    default_base_url = ""
    keyless_server_key = "not-needed"

    def __init__(self, model: str, *, base_url: str | None = None, **options: Any) -> None:
        if not base_url:
            raise ProviderConfigError(
                f"openai-compatible/{model} needs a base URL (--base-url), e.g. http://127.0.0.1:8000/v1 for "
                "vLLM"
            )
        super().__init__(model, base_url=base_url, **options)

    def _missing_key(self) -> str:
        if self.key_env == self.default_key_env:
            return self.keyless_server_key
        return super()._missing_key()

    def _not_found_hint(self) -> str:
        return f"check the model name the server at {self.base_url} serves, and that the base URL ends in /v1"

    def _request_options(self, max_tokens: int, temperature: float) -> dict[str, Any]:
        # Local servers know the classic parameter; not all accept max_completion_tokens.
        return {"max_tokens": max_tokens, "temperature": temperature}
