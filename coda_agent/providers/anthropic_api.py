"""``anthropic/<model>``: Anthropic's messages API through the official async SDK.

The temperature is not sent: API version 2026-10-21 (the default of anthropic>=2, whose SDK has no
such parameter) rejects any sampling parameter, so Claude samples at its default.
"""

from __future__ import annotations

from typing import Any

import anthropic

from ..messages import ChatMessage
from .remote import RemoteProvider, Reply


class AnthropicProvider(RemoteProvider):
    prefix = "anthropic"
    default_key_env = "ANTHROPIC_API_KEY"
    base_url_env = "ANTHROPIC_BASE_URL"
    default_base_url = "https://api.anthropic.com"
    sdk = anthropic

    def _make_client(self) -> anthropic.AsyncAnthropic:
        # An explicit timeout also keeps the SDK from refusing large non-streaming max_tokens.
        return anthropic.AsyncAnthropic(
            api_key=self.api_key, base_url=self.base_url, timeout=self.timeout, max_retries=0
        )

    async def _request(
        self, client: Any, messages: list[ChatMessage], max_tokens: int, temperature: float
    ) -> Reply:
        system = "\n\n".join(m.content for m in messages if m.role == "system")
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "messages": [{"role": m.role, "content": m.content} for m in messages if m.role != "system"],
        }
        if system:
            request["system"] = system
        response = await client.messages.create(**request)
        usage = response.usage
        input_tokens = (
            usage.input_tokens
            + (getattr(usage, "cache_creation_input_tokens", None) or 0)
            + (getattr(usage, "cache_read_input_tokens", None) or 0)
        )
        return Reply(
            text="".join(block.text for block in response.content if block.type == "text"),
            model=response.model,
            input_tokens=input_tokens,
            output_tokens=usage.output_tokens,
            finish_reason=response.stop_reason or "",
        )
