"""Tab-Tab: the next inline suggestion, filled in the background as if the one shown had been accepted.

When a suggestion is shown, the server builds the document the user would have after accepting it (the
suggestion inserted, the cursor after it) and fills there at once, on the engine's worker like any inline
fill. An accept followed by a request at the new cursor then finds its answer ready, or already running;
the request waits for it rather than starting again. The answer comes out of the same fill and
post-processing as any other (`inline.fill_for_inline`), and a request only takes it when its own context
gives the same result-cache key: the same text seen by the model, the same settings, the same model.

Speculative work must never delay real work:
- a request for any other state cancels the speculations still running (the request that showed the
  suggestion excepted: clients ask again at the same place);
- a change that cannot lead to the accepted text (anything but typing the suggestion) drops that document's
  speculations;
- no speculation starts while a code action runs (an urgent fill would take its steps).

Speculations are kept by (uri, digest of the accepted text, cursor); a few finished ones stay, so that
going back to a state (undo, redo) still finds its answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from dfim.engine.api import FillCancelled, FillRequest, FillResult
from dfim.server.documents import Document

log = logging.getLogger("dfim.server")

# dfim/stats: speculations started, their engine calls, requests answered from one (and those that waited
# for it to finish), and those stopped before they finished
SPECULATION_COUNTERS = (
    "speculations",
    "speculation_fills",
    "speculation_hits",
    "speculation_waits",
    "speculation_cancelled",
)
SpeculationKey = tuple[str, str, int]  # (uri, digest of the document text, cursor offset)


def digest(text: str) -> str:
    """A short fingerprint of a document's text (keys compare it instead of the whole text).

    A text over `DIGEST_SPAN` characters is fingerprinted by its length and its two ends, not all of it: in a
    5 MB file every request would otherwise spend ~10 ms of the event loop hashing. Two states of a document
    that this confuses cost nothing but a lookup: `take` serves a speculation only if its result-cache key
    (the exact context the model read) is the request's."""
    if len(text) > DIGEST_SPAN:
        text = f"{len(text)}\0{text[: DIGEST_SPAN // 2]}\0{text[-DIGEST_SPAN // 2 :]}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


DIGEST_SPAN = 256 * 1024  # characters of a text hashed in full


@dataclass
class Speculation:
    """A fill for the document as it would be once a shown suggestion is accepted."""

    uri: str
    origin: SpeculationKey  # the state the suggestion was shown in
    text: str  # the document after the accept
    start: int  # where the suggestion starts in `text`
    insert: str  # the suggestion
    flag: threading.Event = field(default_factory=threading.Event)  # raised: stop the fill
    key: str | None = None  # the result-cache key of the accepted state, once worked out
    task: asyncio.Task | None = None  # -> the cleaned candidates (None: cancelled, failed, nothing to fill)
    # makes the trace of its last fill `dfim/lastTrace`'s, once its answer is taken (not while another
    # suggestion is on the screen)
    show_trace: Callable[[], None] | None = None

    @property
    def cursor(self) -> int:
        return self.start + len(self.insert)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def could_become(self, text: str) -> bool:
        """Whether `text` is the accepted document or a step on the way to it: the state the suggestion was
        shown in, with the start of the suggestion typed (typed-ahead serves the rest of it meanwhile)."""
        typed = len(text) - (len(self.text) - len(self.insert))
        if not 0 <= typed <= len(self.insert):
            return False
        head = self.start + typed
        return text[:head] == self.text[:head] and text[head:] == self.text[self.cursor :]


class Speculations:
    """The server's speculations: started when a suggestion is shown, taken by the request after the
    accept, dropped when the user goes elsewhere."""

    def __init__(self, counters: dict, size: int = 8) -> None:
        self.counters = counters  # the server's (dfim/stats)
        for name in SPECULATION_COUNTERS:
            counters.setdefault(name, 0)
        self.size = size
        self._items: OrderedDict[SpeculationKey, Speculation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def start(self, ls, snapshot: Document, r_start: int, r_end: int, insert: str) -> Speculation | None:
        """Start filling the document `snapshot` would be with text[r_start:r_end] replaced by `insert` (a
        suggestion shown), at the cursor after it; None when it is off, already there, or not now."""
        options = ls.options
        if not options.inline.speculate or not ls.host.ready or code_action_running(ls):
            return None
        text = snapshot.text[:r_start] + insert + snapshot.text[r_end:]
        cursor = r_start + len(insert)
        key = (snapshot.uri, digest(text), cursor)
        existing = self._items.get(key)
        if existing is not None and (existing.running or _result(existing)):
            self._items.move_to_end(key)
            return existing  # the same suggestion shown again: its speculation goes on
        origin = (snapshot.uri, digest(snapshot.text), r_start)
        spec = Speculation(snapshot.uri, origin, text, r_start, insert)
        spec.task = asyncio.ensure_future(self._run(ls, spec, snapshot.language_id))
        self._items[key] = spec
        self._items.move_to_end(key)
        self.counters["speculations"] += 1
        while len(self._items) > self.size:
            _, old = self._items.popitem(last=False)
            old.flag.set()
        return spec

    async def take(self, uri: str, text: str, cursor: int, key: str) -> list[str] | None:
        """The cleaned candidates speculated for this request (`key`: its result-cache key), waiting for
        them while they are computed; None when no speculation assumed this state. A request elsewhere
        cancels the speculations in flight, so that they do not delay it."""
        here = (uri, digest(text), cursor)
        spec = self._items.get(here)
        if spec is None or spec.task is None or (spec.key is not None and spec.key != key):
            self.cancel_running(here)
            return None
        self._items.move_to_end(here)
        if spec.running:
            self.counters["speculation_waits"] += 1
        # shielded: a request cancelled while it waits ($/cancelRequest) leaves the speculation for the next
        ranked = await asyncio.shield(spec.task)
        if ranked is None or spec.key != key:
            return None
        if spec.show_trace is not None:
            spec.show_trace()
        return ranked

    def cancel_running(self, asked: SpeculationKey | None = None) -> None:
        """Stop and forget the speculations in flight, except those of a suggestion shown at `asked` (the
        state a request is for): clients ask again where a suggestion is shown."""
        for spec_key, spec in list(self._items.items()):
            if spec.running and spec.origin != asked:
                self._cancel(spec_key)

    def changed(self, uri: str, text: str) -> None:
        """`uri`'s text is now `text` (didChange): drop its speculations that it can no longer lead to."""
        for spec_key, spec in list(self._items.items()):
            if spec.uri == uri and not spec.could_become(text):
                self._cancel(spec_key)

    def closed(self, uri: str) -> None:
        for spec_key, spec in list(self._items.items()):
            if spec.uri == uri:
                self._cancel(spec_key)

    def _cancel(self, spec_key: SpeculationKey) -> None:
        spec = self._items.pop(spec_key)
        if spec.running:
            spec.flag.set()
            self.counters["speculation_cancelled"] += 1

    async def _run(self, ls, spec: Speculation, language_id: str) -> list[str] | None:
        from dfim.server.documents import Document
        from dfim.server.inline import fill_for_inline, inline_context

        await asyncio.sleep(0)  # the answer that showed the suggestion goes out first
        if spec.flag.is_set() or not ls.host.ready:
            return None
        options = ls.options
        snapshot = Document(uri=spec.uri, text=spec.text, language_id=language_id)
        found = inline_context(ls, snapshot, spec.cursor, options)
        if found is None:
            return None
        ctx, spec.key, extra = found
        cached = ls.cache.get(spec.key)
        if cached is not None:
            return cached
        try:
            outcome = await fill_for_inline(
                ls,
                ctx,
                spec.text,
                options,
                lambda r: speculative_fill(ls, r, spec),
                spec.flag.is_set,
                extra=extra,
            )
        except Exception:  # a speculation's failure is nobody's error: the request after it fills anew
            log.exception("speculative fill failed")
            return None
        if outcome is None or spec.flag.is_set():
            return None
        ranked, _, _, confidence = outcome
        ls.gate_memory.put(spec.key, confidence)  # the request that takes it screens it with this
        return ranked


def _result(spec: Speculation) -> bool:
    """Whether a finished speculation has an answer (a cancelled or failed one is started again)."""
    task = spec.task
    return task is not None and task.done() and not task.cancelled() and task.result() is not None


def code_action_running(ls) -> bool:
    """Whether a code action is running: a speculation would run between its steps and slow it."""
    return any(not flag.is_set() for flags in ls.actions_running.values() for flag in flags)


async def speculative_fill(ls, request: FillRequest, spec: Speculation) -> FillResult | None:
    """One engine call for a speculation: urgent (it runs in the inline fills' context slot, the one the
    request after the accept reads), counted apart from the requests' fills (here and in the engine host)
    and kept out of the status bar; None when cancelled."""
    ls.speculations.counters["speculation_fills"] += 1
    try:
        return await ls.host.fill(
            request, spec.flag, speculative=True, hold_watch=lambda show: setattr(spec, "show_trace", show)
        )
    except FillCancelled:
        return None
