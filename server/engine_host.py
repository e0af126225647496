"""The engine in one worker thread, with cancel flags the engine polls between denoising steps.

Torch work must not run on the event loop (the server would stop reading messages, so it could not even
hear `$/cancelRequest`), and two fills at once would only fight for the same cores. So every engine call goes
through one single-thread executor. Each fill carries a `threading.Event`; raising it makes the engine stop
at its next step boundary (`FillCancelled`), and a fill still queued behind another one is skipped outright.

Urgent fills (inline completions: someone is waiting at the cursor) do not queue behind a long one (a code
action of 48 steps): a non-urgent fill runs the urgent ones waiting at each of its step boundaries
(`FillRequest.between_steps`), in the same worker thread, then goes on. The two kinds use their own context
cache slots, so neither evicts the other's context and a code action does not cost the next keystroke a
full context encode.

Out of memory (`torch.OutOfMemoryError`, GPU or CPU) fails no request outright: the fill is retried once on
a smaller canvas with one candidate, and on CUDA, if that also runs out, the model moves to the CPU for good.

Test hook (off unless the server process has `DFIM_TEST_FAULTS=1`): a fill whose prefix or suffix contains
`<<dfim-fault:error>>` raises a RuntimeError in the worker, `<<dfim-fault:oom>>` raises OutOfMemoryError
on the first attempt only, `<<dfim-fault:oom-always>>` on every attempt (tests/test_faults.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import dataclasses
import logging
import os
import re
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from dfim.engine.api import EngineError, FillCancelled, FillRequest, FillResult
from dfim.server.windows import fit_context_budget, guess_tokens

log = logging.getLogger("dfim.server")
_SURROGATE = re.compile("[\ud800-\udfff]")  # lone UTF-16 halves: JSON can carry them, tokenizers refuse them
FAULTS_ENV = "DFIM_TEST_FAULTS"  # "1" enables the fault markers below (tests only)
URGENT_SLOT, BACKGROUND_SLOT = "inline", "actions"  # the engine's context cache slot of each kind of fill


class EngineHost:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dfim-engine")
        self.engine = None
        self.error: str | None = None
        self.loading = False
        self.generation = 0  # bumps on every (re)load, so a late load of an old model is dropped
        self.fills_started = 0  # fills that reached the engine (tests and benchmarks read this)
        self.fills_completed = 0
        self._queue: dict[Future, threading.Event] = {}  # fills handed to the worker that have not left it
        self._speculative: dict[Future, threading.Event] = {}  # the same, of speculative fills
        self._urgent: deque[tuple[Callable[[], FillResult], Future]] = deque()  # urgent fills not started yet
        self.preempted = 0  # urgent fills run at a step boundary of another fill (tests read this)
        self._nested = 0  # > 0 while such a fill runs (in the worker thread)
        self._drain_queued = False  # a `_run_urgent` is waiting in the executor's queue
        self.oom_retries = 0
        self._last_trim = 0.0
        self.fell_back_to_cpu = False  # set when CUDA ran out of memory and the model moved to the CPU
        self.faults = os.environ.get(FAULTS_ENV) == "1"
        self._moved: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # GPU engine -> its CPU copy
        # Sees every fill (dfim.server.trace_feature): called with the engine and the request before it is queued
        # (it may chain the request's on_step); what it returns gets the result of a fill that completed.
        self.watch: Callable[[Any, FillRequest], Callable[[FillResult], None]] | None = None

    @property
    def ready(self) -> bool:
        return self.engine is not None

    @property
    def queued(self) -> int:
        """Fills handed to the worker that have not left it yet (superseded ones included: the worker skips
        those as soon as it reaches them)."""
        return len(self._queue)

    @property
    def queued_live(self) -> int:
        """Queued fills that will really run (not cancelled or superseded): a backlog shows here."""
        return sum(not flag.is_set() for flag in list(self._queue.values()))

    async def load(self, path: str | None, device: str, fast: bool = True, compile: bool = False) -> None:
        """Load a checkpoint in the worker; on failure `error` holds the message and `engine` stays None.
        `fast`: denoise on the fast path where the device is CUDA (`dfim.engine.inference.fast_backend`);
        `compile`: torch.compile its layers."""
        self.generation += 1
        generation = self.generation
        self.loading = True
        try:
            engine = await asyncio.get_running_loop().run_in_executor(
                self._executor, _load, path, device, fast, compile
            )
        except Exception as exc:  # CheckpointError, missing torch device, a broken file: report, keep serving
            if generation == self.generation:  # with the model loaded before, if there was one
                self.error, self.loading = _one_line(exc), False
            return
        if generation == self.generation:
            self.engine, self.error, self.loading = engine, None, False
            self.fell_back_to_cpu = False

    async def fill(
        self,
        request: FillRequest,
        cancel: threading.Event,
        *,
        urgent: bool = False,
        speculative: bool = False,
        hold_watch: Callable[[Callable[[], None]], None] | None = None,
    ) -> FillResult:
        """Run one fill; raises FillCancelled if `cancel` is raised before or during it (also when this
        coroutine is cancelled: the flag goes up so the worker stops at its next step). An `urgent` fill
        runs before queued ones and at the next step boundary of a running non-urgent one. A `speculative`
        fill (always urgent: work ahead of a request, dfim.server.speculation) is left out of the counts of
        requests' fills (`fills_started`, `fills_completed`, `queued`), so they still tell a backlog.
        `hold_watch`, if given, gets what would tell `watch` of the completed fill, to call when the caller
        wants (a speculation's trace becomes the last one when its suggestion is shown, not before)."""
        engine = self.engine
        if engine is None:
            raise EngineError(self.error or "the model is not loaded")
        request.prefix, request.suffix = scrub(request.prefix), scrub(request.suffix)
        request.middle = [scrub(part) if isinstance(part, str) else part for part in request.middle]
        if request.warm_start is not None:
            request.warm_start = scrub(request.warm_start)
        request.instruction = scrub(request.instruction)
        previous = request.cancel
        request.cancel = (lambda: cancel.is_set() or previous()) if previous else cancel.is_set
        finish = self.watch(engine, request) if self.watch is not None else None
        if urgent or speculative:
            request.cache_slot = URGENT_SLOT
            work: Future = Future()
            self._urgent.append((partial(self._run, engine, request, cancel, not speculative), work))
            # An idle worker starts the drain now, a busy one sooner. One drain waiting in the executor is
            # enough (it runs every urgent fill there is); a drain per fill piled up without end while a
            # steady stream kept the running drain busy (the soak: one work item per keystroke).
            if not self._drain_queued:
                self._drain_queued = True
                self._executor.submit(self._run_urgent)
        else:
            request.cache_slot = BACKGROUND_SLOT
            previous_hook = request.between_steps
            request.between_steps = partial(self._between_steps, previous_hook)
            work = self._executor.submit(self._run, engine, request, cancel)
        queue = self._speculative if speculative else self._queue
        queue[work] = cancel  # until it leaves the worker, or is cancelled while still queued
        work.add_done_callback(lambda done: queue.pop(done, None))
        try:
            result = await asyncio.wrap_future(work)
        except asyncio.CancelledError:
            cancel.set()
            raise
        finally:
            # A failed or cancelled fill's exception sits in `work`, and its traceback holds this frame: with
            # `work` still a local the two form a cycle that only a full garbage collection frees, and the
            # traceback also holds the engine's frames with their logits (MBs per fill). Under a stream of
            # keystrokes, most fills end cancelled, and the soak's heap grew ~7 MB a minute this way.
            del work
        if finish is not None:
            if hold_watch is not None:
                hold_watch(partial(_tell_watcher, finish, result))
            else:
                _tell_watcher(finish, result)
        return result

    def cancel_all(self) -> None:
        """Raise the cancel flag of every fill handed to the worker (shutdown)."""
        for flag in [*self._queue.values(), *self._speculative.values()]:
            flag.set()

    def _run_urgent(self, nested: bool = False) -> None:
        """Run the urgent fills waiting, oldest first (in the worker thread). Nested in a code action's step,
        only the oldest one: the action takes a step between any two urgent fills, so a steady stream of
        inline requests over many documents (each a full fill, the action's step a fraction of one) slows
        an action down by a bounded factor instead of starving it."""
        budget = 1 if nested else float("inf")
        if not nested:
            self._drain_queued = False  # from here on, a new urgent fill queues the next drain
        while self._urgent and budget > 0:
            budget -= 1
            job, work = self._urgent.popleft()
            if not work.set_running_or_notify_cancel():  # its request was cancelled while it waited
                continue
            if nested:
                self.preempted += 1
            self._nested += nested
            try:
                work.set_result(job())
            except FillCancelled as exc:
                work.set_exception(exc.with_traceback(None))  # an expected end: its frames hold tensors
            except Exception as exc:  # the fill's own failure goes to its caller, never to the outer fill
                work.set_exception(exc)
            finally:
                self._nested -= nested
                # `work` holds the exception, whose traceback holds this frame: drop it, so no cycle
                # keeps the fill's memory until a full garbage collection (see `fill`)
                job = work = None

    def _between_steps(self, previous: Callable[[], None] | None) -> None:
        if previous is not None:
            previous()
        if self._urgent:
            self._run_urgent(nested=True)

    def _run(self, engine, request: FillRequest, cancel: threading.Event, counted: bool = True) -> FillResult:
        if cancel.is_set():
            raise FillCancelled("cancelled before it started")
        if counted:
            self.fills_started += 1
        try:
            result = self._fill(self._moved.get(engine, engine), request)
        finally:
            self._trim_heap()
        if counted:
            self.fills_completed += 1
        return result

    def _trim_heap(self) -> None:
        """Give freed heap memory back to the OS, at most once a second. A fill's large short-lived buffers
        (logits, attention) make glibc raise its mmap threshold and keep them in the heap afterwards; under a
        stream of fills the server's RSS would grow by ~200 MB and stay there (scripts/soak.py)."""
        now = time.monotonic()
        if _malloc_trim is None or now - self._last_trim < 1.0:
            return
        self._last_trim = now
        _malloc_trim(0)

    def _fill(self, engine, request: FillRequest) -> FillResult:
        """engine.fill, retried on a smaller canvas (then on the CPU, from CUDA) when memory runs out."""
        import torch

        smaller = dataclasses.replace(request, candidates=1)
        if not any(not isinstance(part, str) for part in request.middle):  # inner holes keep their width
            smaller.max_tokens = max(1, request.max_tokens // 4)
        for attempt, req in enumerate((request, smaller)):
            try:
                self._inject_fault(req, attempt)
                return engine.fill(req)
            except torch.OutOfMemoryError as exc:
                self.oom_retries += 1
                log.warning("out of memory on %s (%s); retrying smaller", engine.device, _one_line(exc))
                _free_memory(engine)
        if engine.device.type != "cuda":
            raise EngineError("out of memory, even on a smaller canvas")
        if self._nested:  # the code action it interrupts holds memory it will give back: fail this fill only
            raise EngineError("out of GPU memory while a code action runs")
        log.warning("out of GPU memory twice: moving the model to the CPU")
        cpu = _load(str(engine.path), "cpu")
        self._moved[engine] = cpu  # fills already queued for the GPU engine run on the CPU one
        if self.engine is engine:
            self.engine, self.fell_back_to_cpu = cpu, True
        return cpu.fill(smaller)

    def _inject_fault(self, request: FillRequest, attempt: int) -> None:
        if not self.faults:
            return
        import torch

        context = request.prefix + request.suffix
        if "<<dfim-fault:error>>" in context:
            raise RuntimeError("injected engine fault")
        if "<<dfim-fault:oom-always>>" in context or ("<<dfim-fault:oom>>" in context and attempt == 0):
            raise torch.OutOfMemoryError("injected out of memory")

    def context_budget(self, prefix_tokens: int, suffix_tokens: int) -> tuple[int, int]:
        """The configured window budgets, cut to the loaded checkpoint's trained context (if it says)."""
        return fit_context_budget(prefix_tokens, suffix_tokens, getattr(self.engine, "trained_context", None))

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` under the loaded model's tokenizer (an estimate before it loads)."""
        engine = self.engine
        if engine is None or engine.tokenizer is None:  # no tokenizer here for a served model
            return guess_tokens(text)
        return len(engine.tokenizer.encode(scrub(text)))

    def token_pieces(self, text: str) -> list[str]:
        """`text` split into the loaded tokenizer's tokens (bytes of a character split over tokens are kept
        together on the first of them, so the pieces always join back to `text`)."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:  # a served model: the text is one piece
            return [text]
        pieces: list[str] = []
        pending = b""
        for token_id in tokenizer.encode(scrub(text)):
            pending += tokenizer.token_bytes(token_id)
            try:
                pieces.append(pending.decode("utf-8"))
                pending = b""
            except UnicodeDecodeError:
                pieces.append("")
        if pending:
            pieces.append(pending.decode("utf-8", "replace"))
        return pieces

    def path_info(self) -> dict | None:
        """Where the loaded model's fills run (`Engine.path_info`); None before a load, and for a served model."""
        describe = getattr(self.engine, "path_info", None)
        return describe() if describe is not None else None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _tell_watcher(finish: Callable[[FillResult], None], result: FillResult) -> None:
    try:
        finish(result)
    except Exception:  # a watcher's bug must not fail the fill
        log.exception("fill watcher failed")


def _load(path: str | None, device: str, fast: bool = True, compile: bool = False):
    from dfim.engine.model.shipped import is_served_url

    if is_served_url(path):  # a model served by `vllm serve` (docs/gpu.md): `device` is the server's
        from dfim.engine.inference.vllm_served import ServedEngine

        return ServedEngine.connect(path)
    from dfim.engine.inference.fill import (
        Engine,  # imported here: torch takes a second, initialize must not wait
    )

    on_gpu = device.startswith("cuda")
    return Engine.load(path or None, device=device, fast=fast and on_gpu, compile=compile and on_gpu)


def _glibc_function(name: str, restype=None):
    """A function of glibc by name, or None (macOS, musl, Windows, or a glibc too old to have it)."""
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    if restype is not None:
        fn.restype = restype
    return fn


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")
    ]  # fmt: skip


_malloc_trim = _glibc_function("malloc_trim")
_mallinfo2 = _glibc_function("mallinfo2", _MallInfo2)  # glibc 2.33 and later


def heap_usage() -> dict[str, float] | None:
    """The C heap, over all of glibc's arenas, in MB: what is allocated (`in_use`: live tensors and every
    other native buffer), what is free but kept (`free`: fragmentation, or memory a trim has not returned
    yet) and what lies in separate mmaps (`mmapped`: blocks above the mmap threshold). Tells a growing RSS
    that is live memory from one that is the allocator's. None off glibc."""
    if _mallinfo2 is None:
        return None
    info = _mallinfo2()
    mb = 2**20
    return {
        "in_use": round(info.uordblks / mb, 1),
        "free": round(info.fordblks / mb, 1),
        "mmapped": round(info.hblkhd / mb, 1),
    }


def scrub(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD: the same length in every position encoding, so offsets
    into the document still hold, and something the tokenizer accepts."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _free_memory(engine) -> None:
    """Drop the context KV cache (rebuilt on the next fill) and hand cached CUDA blocks back."""
    import torch

    engine.drop_idle_caches()
    if engine.device.type == "cuda":
        torch.cuda.empty_cache()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
