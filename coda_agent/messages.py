"""The chat a provider is sent: one schema, below everything that builds, sends or records messages.

Prompts build these, providers send them, run records keep them (``Attempt.messages``); living at the
bottom of the stack lets providers speak it without depending on the store.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ChatMessage(BaseModel):
    """One turn of a chat; a system message, if any, comes first."""

    role: Literal["system", "user", "assistant"]
    content: str
