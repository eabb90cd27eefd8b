"""A scriptable fake LLM server on 127.0.0.1, so tests drive the real Anthropic and OpenAI SDK paths.

It speaks just enough of both wire formats: ``POST /v1/messages`` (Anthropic) and
``POST /v1/chat/completions`` (OpenAI). Each test queues replies per path; every request is
recorded. A request with nothing queued gets a 418, which the providers treat as a bad request,
so a missing script fails fast instead of being retried.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANTHROPIC_PATH = "/v1/messages"
OPENAI_PATH = "/v1/chat/completions"


@dataclass
class ScriptedReply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering, to provoke client timeouts
    # sent as the body instead of ``body`` as JSON (bytes that are not valid UTF-8, say)
    raw: bytes | None = None


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeLLMServer:
    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._queues: dict[str, deque[ScriptedReply]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def reply(
        self,
        path: str,
        body: dict[str, Any],
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        raw: bytes | None = None,
    ) -> None:
        with self._lock:
            self._queues[path].append(ScriptedReply(status, body, headers or {}, delay, raw))

    def requests_to(self, path: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == path]

    def _next(self, path: str) -> ScriptedReply:
        with self._lock:
            if self._queues[path]:
                return self._queues[path].popleft()
        return ScriptedReply(
            418, {"error": {"type": "test_error", "message": f"nothing scripted for {path}"}}
        )

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0]
                with server._lock:
                    server.requests.append(
                        RecordedRequest(path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                scripted = server._next(path)
                if scripted.delay:
                    time.sleep(scripted.delay)
                payload = scripted.raw if scripted.raw is not None else json.dumps(scripted.body).encode()
                try:
                    self.send_response(scripted.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for name, value in scripted.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def anthropic_message(
    text: str, *, input_tokens: int = 10, output_tokens: int = 5, model: str = "claude-sonnet-4-5-20250929"
) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def openai_chat(
    text: str, *, prompt_tokens: int = 10, completion_tokens: int = 5, model: str = "gpt-4.1-2025-04-14"
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def anthropic_error(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def openai_error(
    message: str, *, error_type: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}
