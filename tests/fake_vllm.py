"""A tiny stand-in for `vllm serve` in tests: the two OpenAI-compatible routes dfim calls, on a local port.

vLLM itself cannot be installed here; this answers `/v1/models` and `/v1/chat/completions` the way vLLM's
server does (the same JSON shapes) and records every request, so tests can check what dfim sends.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "google/diffusiongemma-26B-A4B-it"


class FakeVllm:
    """`with FakeVllm(reply="...") as fake:` serves at `fake.url` (the API root, ending in /v1)."""

    def __init__(self, reply: str = "a + b", finish_reason: str = "stop", api_key: str | None = None) -> None:
        self.reply = reply
        self.finish_reason = finish_reason
        self.api_key = api_key
        self.requests: list[tuple[str, dict[str, str], dict[str, Any] | None]] = []  # (path, headers, body)
        self.fail_with: int | None = None  # an HTTP status to answer every chat completion with
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_port}/v1"

    def __enter__(self) -> FakeVllm:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [body for path, _, body in self.requests if path == "/v1/chat/completions" and body]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet test output
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    self._send(401, {"error": "Unauthorized"})
                    return False
                return True

            def do_GET(self) -> None:
                fake.requests.append((self.path, dict(self.headers), None))
                if not self._authorized():
                    return
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                fake.requests.append((self.path, dict(self.headers), body))
                if not self._authorized():
                    return
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": "not found"})
                elif fake.fail_with is not None:
                    self._send(fake.fail_with, {"error": {"message": "The model is overloaded"}})
                else:
                    self._send(
                        200,
                        {
                            "object": "chat.completion",
                            "model": body.get("model"),
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": fake.reply},
                                    "finish_reason": fake.finish_reason,
                                }
                            ],
                            "usage": {"prompt_tokens": 120, "completion_tokens": 4, "total_tokens": 124},
                        },
                    )

        return Handler
