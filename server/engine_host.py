"""The engine in one worker thread, with cancel flags the engine polls between denoising steps.

Torch work must not run on the event loop (the server would stop reading messages, so it could not even
hear `$/cancelRequest`), and two fills at once would only fight for the same cores. So every engine call goes
through one single-thread executor. Each fill carries a `threading.Event`; raising it makes the engine stop
at its next step boundary (`FillCancelled`), and a fill still queued behind another one is skipped outright.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from engine.api import EngineError, FillCancelled, FillRequest, FillResult


class EngineHost:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dfim-engine")
        self.engine = None
        self.error: str | None = None
        self.loading = False
        self.generation = 0  # bumps on every (re)load, so a late load of an old model is dropped
        self.fills_started = 0  # fills that reached the engine (tests and benchmarks read this)
        self.fills_completed = 0

    @property
    def ready(self) -> bool:
        return self.engine is not None

    async def load(self, path: str | None, device: str) -> None:
        """Load a checkpoint in the worker; on failure `error` holds the message and `engine` stays None."""
        self.generation += 1
        generation = self.generation
        self.loading = True
        try:
            engine = await asyncio.get_running_loop().run_in_executor(self._executor, _load, path, device)
        except Exception as exc:  # CheckpointError, missing torch device, a broken file: report, keep serving
            if generation == self.generation:
                self.engine, self.error, self.loading = None, _one_line(exc), False
            return
        if generation == self.generation:
            self.engine, self.error, self.loading = engine, None, False

    async def fill(self, request: FillRequest, cancel: threading.Event) -> FillResult:
        """Run one fill; raises FillCancelled if `cancel` is raised before or during it (also when this
        coroutine is cancelled: the flag goes up so the worker stops at its next step)."""
        engine = self.engine
        if engine is None:
            raise EngineError(self.error or "the model is not loaded")
        previous = request.cancel
        request.cancel = (lambda: cancel.is_set() or previous()) if previous else cancel.is_set
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, self._run, engine, request, cancel
        )
        try:
            return await future
        except asyncio.CancelledError:
            cancel.set()
            raise

    def _run(self, engine, request: FillRequest, cancel: threading.Event) -> FillResult:
        if cancel.is_set():
            raise FillCancelled("cancelled before it started")
        self.fills_started += 1
        result = engine.fill(request)
        self.fills_completed += 1
        return result

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` under the loaded model's tokenizer (an estimate before it loads)."""
        engine = self.engine
        if engine is None:
            return max(1, len(text) // 3)
        return len(engine.tokenizer.encode(text))

    def token_pieces(self, text: str) -> list[str]:
        """`text` split into the loaded tokenizer's tokens (bytes of a character split over tokens are kept
        together on the first of them, so the pieces always join back to `text`)."""
        tokenizer = self.engine.tokenizer
        pieces: list[str] = []
        pending = b""
        for token_id in tokenizer.encode(text):
            pending += tokenizer.token_bytes(token_id)
            try:
                pieces.append(pending.decode("utf-8"))
                pending = b""
            except UnicodeDecodeError:
                pieces.append("")
        if pending:
            pieces.append(pending.decode("utf-8", "replace"))
        return pieces

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _load(path: str | None, device: str):
    from engine.infill import Engine  # imported here: torch takes a second, initialize must not wait

    return Engine.load(path or None, device=device)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
