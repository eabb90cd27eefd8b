"""``manual``: a person is the model, through any chat UI or another coding agent.

Each call writes the chat to ``<dir>/prompt-N.md``, prints one line saying where, and polls for
``<dir>/answer-N.md``. The answer is taken once it is non-empty and unchanged between two polls (so a
half-saved file is not read). Numbering continues after any files already in the folder, so a stale answer is
never picked up, with one exception: when the newest prompt there is exactly the chat to send (a run resumed
while it waited for that answer), it is reused, with the answer already saved for it, if any. No tokens are
counted and nothing is charged. Without a folder given (bare ``manual``) the files go to ``<run-dir>/manual``
once the run directory exists, else ``./coda-manual``; the folder is made at the first call.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Callable
from pathlib import Path

from ..atomic import write_text_atomic
from ..messages import ChatMessage
from .base import Completion, ErrorKind, Provider, ProviderError

_NUMBERED = re.compile(r"^(?:prompt|answer)-(\d+)\.md$")


def _print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def render_prompt(messages: list[ChatMessage]) -> str:
    """The chat as one Markdown file, a section per message."""
    return "\n\n".join(f"## [{m.role}]\n\n{m.content.strip()}" for m in messages) + "\n"


class ManualProvider(Provider):
    name = "manual"

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        timeout: float = 3600.0,
        poll_interval: float = 1.0,
        notify: Callable[[str], None] = _print_to_stderr,
    ) -> None:
        self.directory = Path(directory or "coda-manual")
        self._directory_given = directory is not None
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.notify = notify
        self._next_number: int | None = None

    def bind_run_dir(self, run_dir: Path) -> None:
        if not self._directory_given:
            self.directory = run_dir / "manual"

    async def complete(
        self, messages: list[ChatMessage], *, max_tokens: int, temperature: float
    ) -> Completion:
        prompt = render_prompt(messages)
        if self._next_number is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            numbers = [int(m.group(1)) for p in self.directory.iterdir() if (m := _NUMBERED.match(p.name))]
            newest = max(numbers, default=0)
            asked = self.directory / f"prompt-{newest}.md"
            self._next_number = newest if asked.is_file() and asked.read_text() == prompt else newest + 1
        number = self._next_number
        self._next_number += 1
        prompt_path = self.directory / f"prompt-{number}.md"
        answer_path = self.directory / f"answer-{number}.md"
        write_text_atomic(prompt_path, prompt)
        self.notify(
            f"manual: prompt in {prompt_path}; save the reply as {answer_path} (waiting up to "
            f"{self.timeout:g}s)"
        )
        text = await self._wait_for(answer_path)
        # Whoever answered (a person, a model in another window) was not metered here: the cost is unknown,
        # not 0.
        return Completion(text=text, model="manual", finish_reason="manual", price_known=False)

    async def _wait_for(self, path: Path) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        seen: tuple[int, int] | None = None
        while True:
            if path.is_file():
                stat = path.stat()
                current = (stat.st_size, stat.st_mtime_ns)
                if current == seen and stat.st_size > 0:
                    # whatever was saved: the loop judges it
                    text = path.read_bytes().decode("utf-8", "replace")
                    if text.strip():
                        return text
                seen = current
            if loop.time() >= deadline:
                raise ProviderError(ErrorKind.TIMEOUT, f"manual: no answer in {path} after {self.timeout:g}s")
            await asyncio.sleep(self.poll_interval)
