"""Local telemetry of inline suggestions (summarized by `dfim stats`, in dfim/commands/stats.py).

Events are appended as JSON lines to `<data dir>/telemetry.jsonl` and never leave the machine. One line:

    {"ts": 1767000000.0, "event": "shown", "id": "3f2a...", "language": "python", "mode": "line",
     "chars": 17, "acceptedChars": 0, "latencyMs": 84.2, "steps": 6, "source": "model"}

`event` is one of shown | accepted | partial | rejected | hidden (the confidence gate hid it: no id, no
outcome; dfim.server.gate); `source` (shown only) is model | cache | typed | speculation | cycled (a
candidate after the first, counted shown when its accept arrives: the first then ends as rejected).
`heldForModel` (shown only, when true) marks a suggestion for a request that waited for the model to load:
its latency is mostly the load, so `dfim stats` counts it apart from the latencies. `acceptedChars` counts
what the user kept (all of it for accepted, a prefix for partial). A partial accept
may be followed by more of the same suggestion (accept word, accept word, accept all): each is recorded
again with the running total, and the summary counts only the last outcome of each id.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

FILE_NAME = "telemetry.jsonl"
MAX_BYTES = 8 * 2**20  # rotate to telemetry.jsonl.1 past this size
log = logging.getLogger("dfim.server")


def data_dir(configured: str = "") -> Path:
    """Where telemetry lives: the setting, else $DFIM_DATA_DIR, else $XDG_DATA_HOME/dfim, else ~/.local/share/dfim."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get("DFIM_DATA_DIR"):
        return Path(os.environ["DFIM_DATA_DIR"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "dfim"


DIR_MODE = 0o700  # telemetry is the user's own: no one else on the machine reads it
FILE_MODE = 0o600
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a symlink planted as the file is not followed


def _tighten(path: Path, mode: int) -> None:
    """Take group and other permissions away from a folder or file of ours made before they were private.
    A folder we do not own (a chosen dataDir) is left as it is."""
    try:
        info = os.stat(path)
        if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == getattr(os, "getuid", lambda: info.st_uid)():
            os.chmod(path, stat.S_IMODE(info.st_mode) & mode)
    except OSError:
        pass


class Telemetry:
    def __init__(
        self, directory: Path | str, enabled: bool = True, on_failure: Callable[[str], None] | None = None
    ) -> None:
        self.directory = Path(directory)
        self.enabled = enabled
        self.failed = False  # a write failed: said once in the log (and to `on_failure`), not for every event
        self.on_failure = on_failure  # the server shows the user the first failure (once per session)
        self._tightened = False

    def problem(self) -> str | None:
        """Why events cannot be written to the directory (it cannot be created, or written to), or None."""
        if not self.enabled:
            return None
        try:
            os.close(self._open())
        except OSError as exc:
            return f"{self.directory} cannot be written ({exc.strerror or exc})"
        return None

    def _open(self) -> int:
        """The telemetry file opened for appending: created 0600 in a folder created 0700 (both tightened
        once if they already exist with wider permissions); a symlink in its place is refused."""
        self.directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        if not self._tightened:
            self._tightened = True
            _tighten(self.directory, DIR_MODE)
            _tighten(self.path.with_name(FILE_NAME + ".1"), FILE_MODE)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)  # an older file, or a umask that took bits away
        except OSError:
            os.close(fd)
            raise
        return fd

    @property
    def path(self) -> Path:
        return self.directory / FILE_NAME

    def record(self, event: str, **fields) -> None:
        if not self.enabled:
            return
        line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields}, separators=(",", ":"))
        try:
            if self.path.exists() and self.path.stat().st_size > MAX_BYTES:
                self.path.replace(self.path.with_name(FILE_NAME + ".1"))
            with os.fdopen(self._open(), "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as exc:  # telemetry must never break completions
            if not self.failed:
                self.failed = True
                message = f"telemetry: cannot write {self.path} ({exc.strerror or exc}); events are dropped"
                log.warning("%s", message)
                if self.on_failure is not None:
                    try:
                        self.on_failure(message)
                    except Exception:  # noqa: BLE001 - telling the user must not break the fill either
                        log.exception("telemetry: the failure could not be reported")


@dataclass
class Shown:
    id: str
    uri: str
    text: str
    language: str
    typed: int = 0  # characters of it the user has typed since (typed-ahead)
    kept: int = 0  # characters the client reported accepted so far (partial accepts)


class SuggestionTracker:
    """Follows each shown suggestion to its outcome.

    accepted: the client ran the item's accept command (or the user typed all of it);
    partial: the client reported a partial accept, or the user typed part of it and moved on;
    rejected: a new suggestion replaced it, or the document closed, with nothing of it kept.
    """

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self.pending: dict[str, Shown] = {}  # uri -> last shown suggestion
        self.by_id: dict[str, Shown] = {}
        # Partly accepted suggestions, which may still grow to accepted: VS Code inserts a whole accepted
        # item first and runs its accept command afterwards, so a client's watcher reports "partial" first.
        self.partial: dict[str, Shown] = {}
        # uri -> id -> the other candidates of its last answer (cycling): not shown until the user cycles to
        # one, which the server learns only when it is accepted (the client runs that item's command).
        self.alternatives: dict[str, dict[str, Shown]] = {}

    def shown(self, shown: Shown, **fields) -> None:
        self.supersede(shown.uri)
        self.pending[shown.uri] = shown
        self.by_id[shown.id] = shown
        if len(self.by_id) > 1000:
            for key in list(self.by_id)[:500]:
                self.by_id.pop(key, None)
        self.telemetry.record("shown", id=shown.id, language=shown.language, chars=len(shown.text), **fields)

    def alternative(self, shown: Shown) -> None:
        """A candidate returned after the first one: shown only if the user cycles to it."""
        self.alternatives.setdefault(shown.uri, {})[shown.id] = shown

    def _cycled_to(self, suggestion_id: str) -> Shown | None:
        """An alternative the client reports taken: it was on screen after all, in place of the first
        candidate, which ends as not taken (`shown` supersedes it); the answer's other candidates are moot."""
        shown = next((a[suggestion_id] for a in self.alternatives.values() if suggestion_id in a), None)
        if shown is not None:
            self.shown(shown, source="cycled")  # supersedes the first and drops the answer's others
        return shown

    def typed(self, uri: str, count: int) -> None:
        """The user has typed the first `count` characters of the pending suggestion."""
        shown = self.pending.get(uri)
        if shown is None:
            return
        shown.typed = max(shown.typed, count)
        if shown.typed >= len(shown.text):
            self._finish(shown, "accepted", len(shown.text))

    def accepted(self, suggestion_id: str) -> None:
        shown = (
            self.by_id.get(suggestion_id) or self.partial.get(suggestion_id) or self._cycled_to(suggestion_id)
        )
        if shown is not None:
            self._finish(shown, "accepted", len(shown.text))

    def partially_accepted(self, suggestion_id: str, accepted_chars: int) -> None:
        shown = (
            self.by_id.get(suggestion_id) or self.partial.get(suggestion_id) or self._cycled_to(suggestion_id)
        )
        if shown is None:
            return
        chars = max(0, min(accepted_chars, len(shown.text)))
        if chars <= shown.kept and suggestion_id in self.partial:
            return  # nothing new
        shown.kept = chars
        self._finish(shown, "accepted" if chars == len(shown.text) else "partial", chars)

    def rejected(self, suggestion_id: str) -> None:
        shown = self.by_id.get(suggestion_id)
        if shown is not None:
            self._finish(shown, "partial" if shown.typed else "rejected", shown.typed)

    def supersede(self, uri: str) -> None:
        """A new suggestion (not a typed-ahead continuation) or a close ends the pending one, and the other
        candidates of its answer."""
        self.alternatives.pop(uri, None)
        shown = self.pending.get(uri)
        if shown is not None:
            self._finish(shown, "partial" if shown.typed else "rejected", shown.typed)

    def _finish(self, shown: Shown, event: str, accepted_chars: int) -> None:
        if self.pending.get(shown.uri) is shown:
            del self.pending[shown.uri]
        if self.by_id.pop(shown.id, None) is None and self.partial.pop(shown.id, None) is None:
            return  # already resolved
        if event == "partial":
            self.partial[shown.id] = shown
            if len(self.partial) > 100:
                self.partial.pop(next(iter(self.partial)))
        self.telemetry.record(
            event, id=shown.id, language=shown.language, chars=len(shown.text), acceptedChars=accepted_chars
        )


# ---- dfim stats ----------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def _number(value: object) -> bool:
    """A finite JSON number (not a bool, not NaN or Infinity, which Python's json reads), and one a float
    holds: `10**400` is a JSON int that `float()` and `math.isfinite` refuse with OverflowError."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def well_formed(event: dict) -> bool:
    """Whether `summarize` can count the event: the fields it reads have their types, or are absent. The
    file is ours, but may be hand-edited or written by another version; a bad event is skipped like a torn
    line, rather than failing the whole summary."""
    return (
        isinstance(event.get("event"), str | type(None))
        and isinstance(event.get("id"), str | type(None))
        and (event.get("acceptedChars") is None or _number(event["acceptedChars"]))
    )


def summarize(events: list[dict]) -> dict:
    counts = {name: 0 for name in ("shown", "accepted", "partial", "rejected")}
    latencies: list[float] = []
    model_latencies: list[float] = []
    accepted_chars = 0
    held = 0  # shown after waiting for the model to load: left out of the latencies
    events = [event for event in events if well_formed(event)]
    # the last outcome of each suggestion (a partial accept may be followed by a bigger one, or accepted)
    last = {event.get("id"): n for n, event in enumerate(events) if event.get("event") != "shown"}
    for n, event in enumerate(events):
        if event.get("event") != "shown" and last.get(event.get("id")) != n:
            continue
        kind = event.get("event")
        if kind in counts:
            counts[kind] += 1
        if kind == "shown" and event.get("heldForModel") is True:  # its latency is the model's load
            held += 1
        elif kind == "shown" and _number(event.get("latencyMs")):  # NaN would make every percentile NaN
            latencies.append(float(event["latencyMs"]))
            if event.get("source", "model") == "model":
                model_latencies.append(float(event["latencyMs"]))
        if kind in ("accepted", "partial"):
            accepted_chars += int(event.get("acceptedChars") or 0)
    shown = counts["shown"]
    summary: dict = dict(counts)
    summary["acceptance_rate"] = counts["accepted"] / shown if shown else 0.0
    summary["partial_rate"] = counts["partial"] / shown if shown else 0.0
    summary["accepted_chars"] = accepted_chars
    summary["held_for_model"] = held
    # shown = accepted + partial + rejected + no_outcome: a suggestion still on screen, or left without a
    # word (typed over, the editor closed); negative never (an outcome whose `shown` was rotated away is
    # counted among the outcomes only)
    summary["no_outcome"] = max(0, shown - counts["accepted"] - counts["partial"] - counts["rejected"])
    for label, values in (("latency", latencies), ("model_latency", model_latencies)):
        summary[f"{label}_n"] = len(values)  # the samples behind the percentiles
        for q in (50, 90, 95, 99):
            summary[f"{label}_p{q}"] = percentile(values, q) if values else None
    return summary


class NotARegularFile(OSError):
    pass


def _lines(path: Path) -> Iterator[str]:
    """The lines of a regular file. A FIFO, a device or a folder in its place is refused before a byte is
    read (opened without blocking, then checked): reading a FIFO would wait for a writer forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(0, "not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, encoding="utf-8", errors="replace", newline=None) as f:
        yield from f


def read_events(path: Path) -> list[dict]:
    """The events of `path` and its rotated predecessor (missing files hold none). OSError when one cannot
    be read (a folder, a FIFO or a device in its place, no permission). Any line that is not a JSON object
    is skipped: a torn line, garbage, a number too long for Python's int limit, nesting too deep."""
    events = []
    for candidate in (path.with_name(path.name + ".1"), path):
        try:
            lines = _lines(candidate)
            for line in lines:
                try:
                    event = json.loads(line)
                except (
                    ValueError,
                    RecursionError,
                ):  # JSONDecodeError is a ValueError, as is a 5000-digit int
                    continue  # a torn last line must not hide the rest
                if isinstance(event, dict):
                    events.append(event)
        except FileNotFoundError:
            continue
    return events
