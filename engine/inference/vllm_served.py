"""A DiffusionGemma served by `vllm serve` on a GPU machine, reached over its OpenAI-compatible HTTP API.

One `vllm serve` serves a team; each editor's dfim server points its model path at it
(`dfim serve --model http://gpu-box:8000/v1`, or the `dfim.model.path` setting). A fill is one
`/v1/chat/completions` request: the request as a user turn (`vllm_backend.chat_messages`), which vLLM
renders with the checkpoint's own chat template and tokenizes without adding special tokens, so the
template's `<bos>` is the only one (`add_special_tokens: false` is sent anyway: it is vLLM's default for
chat, not every server's). `/v1/completions` is not used: it would add a BOS to a rendered prompt.

The standard library only (urllib, json): nothing to install on the editor's machine. What the served
model cannot give the server is left out rather than faked: no token scores (so the confidence gate has
nothing to judge and shows every suggestion), no tokenizer (the server falls back to its character-based
token estimate for the context windows), one candidate per fill.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from dfim.engine.api import EngineError, FillCancelled, FillRequest, FillResult, SamplerSettings
from dfim.engine.inference.vllm_backend import (
    CANVAS_LENGTH,
    CHAT_TEMPLATE_KWARGS,
    chat_messages,
    strip_fences,
)

API_KEY_ENV = "DFIM_VLLM_API_KEY"  # sent as a bearer token, for a server started with `vllm serve --api-key`
TIMEOUT_S = 30.0


def api_base(url: str) -> str:
    """The API root, `.../v1`, whether the user gave the server's address or the API root itself."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def chat_body(model: str, request: FillRequest, language: str = "") -> dict[str, Any]:
    """The `/v1/chat/completions` request for one fill. `add_special_tokens` and `chat_template_kwargs` are
    vLLM's extensions of the OpenAI schema."""
    body: dict[str, Any] = {
        "model": model,
        "messages": chat_messages(request, language),
        "max_tokens": request.max_tokens,
        "add_special_tokens": False,
        "chat_template_kwargs": CHAT_TEMPLATE_KWARGS,
    }
    if request.seed is not None:
        body["seed"] = request.seed
    if request.stop:
        body["stop"] = list(request.stop)
    return body


@dataclass(frozen=True)
class ServedDevice:
    """Where the model runs, as the server shows it: not a torch device (out-of-memory recovery, which
    moves a local model to the CPU, does not apply)."""

    url: str
    type: str = "remote"

    def __str__(self) -> str:
        return f"vLLM at {self.url}"


class ServedEngine:
    """The part of `dfim.engine.inference.fill.Engine` the server uses, backed by a served vLLM."""

    tokenizer = None  # the server estimates tokens from characters (dfim.server.windows.guess_tokens)
    trained_context = None
    is_random = False

    def __init__(
        self, url: str, model: str, *, api_key: str | None = None, timeout: float = TIMEOUT_S
    ) -> None:
        self.path = url
        self.base = api_base(url)
        self.model_name = model
        self.device = ServedDevice(url)
        # The server reads step caps from these; the served model denoises with its own generation config.
        self.settings = SamplerSettings()
        self.api_key = api_key
        self.timeout = timeout

    @classmethod
    def connect(cls, url: str, model: str | None = None, *, timeout: float = TIMEOUT_S) -> ServedEngine:
        """Reach the server and pick its model (the first it lists, unless named): a wrong address or a
        server that is down fails here, at load, with one line, not at the first keystroke."""
        engine = cls(url, model or "", api_key=os.environ.get(API_KEY_ENV) or None, timeout=timeout)
        listed = [entry.get("id") for entry in engine._call("GET", "/models").get("data", [])]
        if not listed:
            raise EngineError(f"{engine.base} serves no model")
        if model and model not in listed:
            raise EngineError(
                f"{engine.base} does not serve {model} (it serves {', '.join(map(str, listed))})"
            )
        engine.model_name = model or str(listed[0])
        return engine

    def fill(self, request: FillRequest, language: str = "") -> FillResult:
        if request.cancel is not None and request.cancel():
            raise FillCancelled("cancelled before it was sent")
        start = time.perf_counter()
        reply = self._call("POST", "/chat/completions", chat_body(self.model_name, request, language))
        latency_ms = (time.perf_counter() - start) * 1000
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise EngineError(f"{self.base}: a chat completion without a message") from None
        usage = reply.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        return FillResult(
            text=strip_fences(text),
            steps=0,  # the served sampler does not report its steps
            canvas_length=CANVAS_LENGTH,
            tokens=int(usage.get("completion_tokens") or 0),
            encoded_tokens=prompt_tokens,
            context_tokens=prompt_tokens,
            latency_ms=latency_ms,
            stop_reason="max_steps" if choice.get("finish_reason") == "length" else "stable",
        )

    def drop_idle_caches(self) -> None:
        """Nothing is cached here: the server holds the KV cache."""

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        http = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(http, timeout=self.timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            detail = err.read().decode("utf-8", "replace").strip().splitlines()
            raise EngineError(
                f"{self.base}{path}: HTTP {err.code} {detail[0] if detail else err.reason}"
            ) from None
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise EngineError(f"{self.base}{path}: cannot reach the vLLM server ({reason})") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EngineError(f"{self.base}{path}: the reply is not JSON") from None
