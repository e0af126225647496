"""`dfim/lastTrace`: the denoising canvas of the server's last fill, as the page `dfim trace` writes.

Every fill (inline or code action) is watched through `EngineHost.watch`: an `dfim.engine.inference.trace.Recorder` on the
request's `on_step` keeps each step's per-position report (argmax token, confidence, kept or renoised,
pinned). When the fill completes, its frames become the last trace and the previous one is dropped, so the
server holds one trace at most (a few thousand numbers for an inline fill; of a fill longer than MAX_FRAMES
steps, its last MAX_FRAMES). A cancelled or failed fill leaves the last trace as it was.

Request params: `{"nonce"?: string}`. Result: null before any fill completed, else
`{"html", "fill", "steps", "frames", "latencyMs", "stopReason", "model", "randomModel", "prefix"}`, where
`html` is `dfim.engine.inference.trace.build_html` (one view for the CLI and the editors); with a nonce its
Content-Security-Policy allows only the style and script blocks carrying it (an editor's webview).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from dfim.engine.api import FillRequest, FillResult, StepInfo
from dfim.engine.inference.trace import NONCE, Recorder, Trace, build_html, context_head, context_tail

log = logging.getLogger("dfim.server")
LAST_TRACE_METHOD = "dfim/lastTrace"
# Steps kept of one fill: an inline fill has at most 16 a canvas; a long rewrite keeps its last 256 steps
# (at most 256 positions each), a few MB at worst.
MAX_FRAMES = 256


class LastTrace:
    """The trace of the last completed fill; `watch` is the EngineHost hook."""

    def __init__(self) -> None:
        self.trace: Trace | None = None
        self.prefix = ""  # the whole prefix the last traced fill read (the trace keeps only its tail)
        self.recorded = 0  # completed fills seen (tests)
        self._lock = threading.Lock()

    def watch(self, engine: Any, request: FillRequest) -> Callable[[FillResult], None]:
        tokenizer = getattr(engine, "tokenizer", None)
        recorder = Recorder(getattr(tokenizer, "eos_id", -1), getattr(tokenizer, "pad_id", -1), MAX_FRAMES)
        own = request.on_step
        if own is None:
            request.on_step = recorder.on_step
        else:

            def both(info: StepInfo) -> None:
                recorder.on_step(info)
                own(info)

            request.on_step = both
        model = str(getattr(engine, "model_name", ""))
        random_model = bool(getattr(engine, "is_random", False))

        def finish(result: FillResult) -> None:
            trace = recorder.trace(request, result, model, random_model)
            # only the context the page shows: an inline request's prefix may be thousands of characters
            trace.prefix, trace.suffix = context_tail(trace.prefix), context_head(trace.suffix)
            with self._lock:
                self.trace = trace
                self.prefix = request.prefix
                self.recorded += 1

        return finish

    def get(self) -> Trace | None:
        with self._lock:
            return self.trace


def _param(params: Any, name: str) -> Any:
    if isinstance(params, dict):
        return params.get(name)
    return getattr(params, name, None)


def last_trace_result(trace: Trace | None, nonce: Any = None) -> dict | None:
    """The `dfim/lastTrace` answer for `trace`; ValueError on a nonce that is not a string of 16-128
    base64/url-safe characters."""
    if nonce is not None and not (isinstance(nonce, str) and NONCE.fullmatch(nonce)):
        raise ValueError("nonce: 16-128 characters of A-Z a-z 0-9 + / = _ -")
    if trace is None:
        return None
    return {
        "html": build_html(trace, nonce),
        "fill": trace.fill,
        "steps": trace.steps,
        "frames": len(trace.frames),
        "latencyMs": trace.latency_ms,
        "stopReason": trace.stop_reason,
        "model": trace.model,
        "randomModel": trace.random_model,
    }


def register(ls) -> None:
    from pygls.exceptions import JsonRpcInvalidParams

    keeper = LastTrace()
    ls.last_trace = keeper
    ls.host.watch = keeper.watch

    @ls.feature(LAST_TRACE_METHOD)
    def last_trace(ls, params: Any = None) -> dict | None:
        try:
            result = last_trace_result(keeper.get(), _param(params, "nonce"))
        except ValueError as exc:
            raise JsonRpcInvalidParams(f"dfim: {exc}") from None
        if result is not None:
            result["prefix"] = keeper.prefix  # extra context included (server/extra_context.py)
        return result
