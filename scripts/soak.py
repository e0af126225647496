"""Soak test of `dfim serve` over stdio: many documents, a steady mix of typing, inline requests,
cancellations and code actions, for as long as you like; does the server's memory level off?

    python scripts/soak.py [--model PATH | --random] [--minutes 30] [--rate 20] [--docs 10] [--json]

Opens `--docs` documents (fixture files). `--rate` times a second it edits the next document (round
robin) and asks for an inline completion at the new cursor, the way an editor does while someone types:

- an edit types one character of the fixture's text at the end of the document; every `--revert-every`
  characters a document instead loses everything typed into it (one ranged delete, as an undo does), so
  documents stay the same size over a long run and memory growth is the server's, not the text's;
- every 4th inline request is withdrawn with `$/cancelRequest` 20 ms later (a client that gave up);
- every `--action-every`-th tick also asks for code actions over 3 lines of one more document, never typed
  into (a selection walking down it), and one list in `--resolve-every` has its first action resolved (a
  real fill, run to its edit; ContentModified or a cancel is counted, not an error).

Nothing waits for the answers. Every `--sample-s` seconds the server's RSS is sampled and a progress line goes
to stderr. At the end it prints a table:

- requests by kind (inline, code action, resolve) with answers, errors and latency p50/p90/p99/max;
- engine fills started/completed/cancelled, backlog (the largest `engine_queued` seen and, in brackets,
  `engine_queued_live`, the ones not superseded or cancelled), the drain after the last request, and what
  is left queued;
- server RSS before the load, at its peak and at the end; the least-squares slope of RSS over the last
  half of the samples (MB per minute) and the growth it predicts over that half; and whether RSS levelled
  off: that predicted growth is at most `--flat-mb` (10 MB by default: about the noise of the allocator
  keeping and returning arenas);
- an RSS plot (one character per sample) and, with `--csv FILE`, the samples as seconds,MB.

Targets (issues 8 and 34): every request answered, nothing queued at the end, no errors, RSS flat over the
last half. Exit status 0 when all hold. Latencies measured on a shared or loaded machine are noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lsprotocol import types  # noqa: E402
from pygls.exceptions import JsonRpcException  # noqa: E402

from tests.robustness_helpers import ServerSession, rss_bytes  # noqa: E402
from tests.server_helpers import random_checkpoint  # noqa: E402

LANGUAGES = {".py": "python", ".js": "javascript", ".ts": "typescript", ".go": "go", ".rs": "rust"}
MB = 2**20
CONTENT_MODIFIED, REQUEST_CANCELLED = -32801, -32800


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))]


def slope_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute (nan with fewer than 2 samples)."""
    if len(samples) < 2:
        return float("nan")
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return float("nan")
    return sum((t - mean_t) * (v - mean_v) for t, v in samples) / var * 60.0


def heap_summary(heap: list[tuple[float, object]], flat_mb: float) -> dict:
    """The heap samples (dicts, or None off glibc) and, per part, its slope over the last half of the run."""

    def as_dict(h: object) -> dict | None:  # the client hands JSON objects back as named tuples
        if h is None or isinstance(h, dict):
            return h
        return h._asdict() if hasattr(h, "_asdict") else dict(vars(h))

    timeline = [(t, as_dict(h)) for t, h in heap]
    parts = {}
    for part in ("in_use", "free", "mmapped"):
        series = [(t, float(h[part])) for t, h in timeline if h and h.get(part) is not None]
        if len(series) >= 2:
            parts[part] = levelling(series, flat_mb)
    return {"timeline": timeline, "levelling": parts}


def levelling(samples: list[tuple[float, float]], flat_mb: float) -> dict:
    """Does RSS level off? The slope over the last half of the samples and the growth it predicts there."""
    half = samples[len(samples) // 2 :]
    slope = slope_per_min(half)
    span_min = (half[-1][0] - half[0][0]) / 60.0 if len(half) >= 2 else 0.0
    predicted = slope * span_min if slope == slope else float("nan")
    return {
        "samples": len(samples),
        "last_half_from_s": round(half[0][0], 1) if half else None,
        "slope_mb_per_min": round(slope, 2),
        "growth_last_half_mb": round(predicted, 1),
        "flat_mb": flat_mb,
        "flat": bool(predicted == predicted and predicted <= flat_mb),
    }


def plot(samples: list[tuple[float, float]], width: int = 72) -> str:
    """RSS over time, one character per sample (the last `width`), scaled between the lowest and highest."""
    if not samples:
        return ""
    values = [v for _, v in samples][-width:]
    lo, hi = min(values), max(values)
    bars = "▁▂▃▄▅▆▇█"
    scale = (len(bars) - 1) / (hi - lo) if hi > lo else 0.0
    line = "".join(bars[int(round((v - lo) * scale))] if scale else bars[0] for v in values)
    return f"RSS {lo:.0f}..{hi:.0f} MB over {samples[-1][0] / 60:.1f} min: {line}"


class Typist:
    """One document being typed into: it re-types `source` (a fixture's text) at the end of the document, and
    deletes what it typed every `revert_every` characters."""

    def __init__(self, uri: str, text: str, source: str, revert_every: int = 0) -> None:
        self.uri = uri
        self.text = text
        self.source = source or "x = 1\n"
        self.next = 0
        self.revert_every = revert_every
        self.typed = 0
        lines = text.split("\n")
        self.line, self.character = len(lines) - 1, len(lines[-1])  # the cursor, in UTF-16 units
        self.origin = (self.line, self.character, len(text))  # where typing starts, and the text's length

    def type_one(self, session: ServerSession) -> None:
        if self.revert_every and self.typed >= self.revert_every:
            self.revert(session)
            return
        ch = self.source[self.next % len(self.source)]
        self.next += 1
        self.typed += 1
        pos = types.Position(self.line, self.character)
        session.change(self.uri, ch, types.Range(start=pos, end=pos))
        self.text += ch
        if ch == "\n":
            self.line, self.character = self.line + 1, 0
        else:
            self.character += 2 if ord(ch) > 0xFFFF else 1

    def revert(self, session: ServerSession) -> None:
        """Delete everything typed: one ranged change from the origin to the cursor."""
        line, character, length = self.origin
        rng = types.Range(
            start=types.Position(line, character), end=types.Position(self.line, self.character)
        )
        session.change(self.uri, "", rng)
        self.text = self.text[:length]
        self.line, self.character = line, character
        self.typed = 0


class Kind:
    """Answers, errors and latencies of one kind of request."""

    def __init__(self) -> None:
        self.sent = 0
        self.latencies: list[float] = []
        self.outcomes: dict[str, int] = {}
        self.errors: list[str] = []

    def done(self, outcome: str, ms: float, error: str | None = None) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.latencies.append(ms)
        if error is not None:
            self.errors.append(error)

    def summary(self) -> dict:
        lat = self.latencies
        return {
            "sent": self.sent,
            "answered": len(lat),
            "unanswered": self.sent - len(lat),  # still in flight when the drain timed out
            "outcomes": dict(sorted(self.outcomes.items())),
            "errors": self.errors[:5],
            "error_count": len(self.errors),
            "latency_ms": {
                "p50": round(pct(lat, 50), 1),
                "p90": round(pct(lat, 90), 1),
                "p95": round(pct(lat, 95), 1),
                "p99": round(pct(lat, 99), 1),
                "max": round(max(lat, default=float("nan")), 1),
            },
        }


async def soak(
    session: ServerSession,
    files: list[Path],
    docs: int = 10,
    rate: float = 20.0,
    seconds: float = 60.0,
    drain_timeout: float = 60.0,
    action_every: int = 0,
    resolve_every: int = 10,
    revert_every: int = 0,
    sample_s: float = 10.0,
    flat_mb: float = 10.0,
    log=None,
) -> dict:
    """Run the load against a started, ready session; returns the measurements (see the module docstring)."""
    loop = asyncio.get_running_loop()
    protocol = session.client.protocol
    typists = []
    for i in range(docs):
        path = files[i % len(files)]
        source = path.read_text(encoding="utf-8")
        uri = f"file:///soak/doc{i}{path.suffix}"
        session.open(uri, source, LANGUAGES.get(path.suffix, "plaintext"))
        typists.append(Typist(uri, source, source, revert_every))
    # Code actions go to a document of their own that is never typed into, so a resolved action runs to its
    # edit (in a document being typed into, nearly every resolve ends in ContentModified).
    action_source = files[0].read_text(encoding="utf-8")
    action_uri = f"file:///soak/actions{files[0].suffix}"
    action_lines = max(1, action_source.count("\n"))
    if action_every:
        session.open(action_uri, action_source, LANGUAGES.get(files[0].suffix, "plaintext"))
    await session.stats()  # the opens are processed
    before = await session.stats()
    rss_before = rss_bytes(session.pid)
    rss_peak, queued_peak, live_peak = rss_before, 0, 0
    inline, actions, resolves = Kind(), Kind(), Kind()
    pending: set[asyncio.Future] = set()
    samples: list[tuple[float, float]] = [(0.0, round(rss_before / MB, 1))]  # (seconds into the run, MB)
    # glibc's heap beside each RSS sample (the server's `heap_mb`: in use, free but kept, mmapped), from the
    # latest stats: a growing RSS is live native memory when `in_use` grows, the allocator's when `free` does
    heap_last = getattr(before, "heap_mb", None)
    heap: list[tuple[float, object]] = [(0.0, heap_last)]

    async def timed(
        kind: Kind, method: str, params, msg_id: str, cancel_after: float | None = None, classify=None
    ):
        kind.sent += 1
        t0 = loop.time()
        future = asyncio.wrap_future(protocol.send_request(method, params, msg_id=msg_id))
        if cancel_after is not None:

            async def withdraw() -> None:
                await asyncio.sleep(cancel_after)
                if not future.done():
                    protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))

            loop.create_task(withdraw())
        try:
            result = await future
        except JsonRpcException as exc:
            ms = (loop.time() - t0) * 1000
            if exc.code == REQUEST_CANCELLED:
                kind.done("cancelled", ms)
            elif exc.code == CONTENT_MODIFIED:
                kind.done("modified", ms)
            else:
                kind.done("error", ms, f"{exc.code}: {exc.message}")
            return None
        kind.done(classify(result) if classify else "answered", (loop.time() - t0) * 1000)
        return result

    async def one_inline(typist: Typist, n: int) -> None:
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=typist.uri),
            position=types.Position(typist.line, typist.character),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        )
        cancel = 0.02 if n % 4 == 3 else None  # a client that gives up on this one
        await timed(
            inline,
            types.TEXT_DOCUMENT_INLINE_COMPLETION,
            params,
            f"soak-{n}",
            cancel,
            classify=lambda result: "items" if result is not None and result.items else "null",
        )

    async def one_action(k: int) -> None:
        first = (k * 3) % max(1, action_lines - 3)  # a 3-line selection walking down the document
        last = min(first + 3, action_lines)
        params = types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=action_uri),
            range=types.Range(start=types.Position(first, 0), end=types.Position(last, 0)),
            context=types.CodeActionContext(diagnostics=[]),
        )
        offered = await timed(actions, types.TEXT_DOCUMENT_CODE_ACTION, params, f"soak-action-{k}")
        if resolve_every and k % resolve_every == 0 and offered:
            await timed(resolves, types.CODE_ACTION_RESOLVE, offered[0], f"soak-resolve-{k}")

    def spawn(coro) -> None:
        task = loop.create_task(coro)
        pending.add(task)
        task.add_done_callback(pending.discard)

    start = loop.time()
    next_stats, next_sample = start + 1.0, start + sample_s
    n = 0
    while True:
        now = loop.time()
        if now - start >= seconds:
            break
        due = start + n / rate
        if now < due:
            await asyncio.sleep(due - now)
            continue
        typist = typists[n % docs]
        typist.type_one(session)
        spawn(one_inline(typist, n))
        if action_every and n % action_every == action_every // 2:
            spawn(one_action(n // action_every))
        n += 1
        now = loop.time()
        if now >= next_stats:  # once a second: the backlog (answered between requests)
            next_stats += 1.0
            stats_task = loop.create_task(session.stats())

            def sampled(t: asyncio.Task) -> None:
                nonlocal queued_peak, live_peak, heap_last
                if not t.cancelled() and t.exception() is None:
                    heap_last = getattr(t.result(), "heap_mb", None)
                    queued_peak = max(queued_peak, t.result().engine_queued)
                    live_peak = max(live_peak, t.result().engine_queued_live)

            stats_task.add_done_callback(sampled)
        if now >= next_sample:
            next_sample += sample_s
            mb = round(rss_bytes(session.pid) / MB, 1)
            samples.append((round(now - start, 1), mb))
            heap.append((round(now - start, 1), heap_last))
            rss_peak = max(rss_peak, mb * MB)
            if log is not None:
                errors = inline.summary()["error_count"] + actions.summary()["error_count"]
                errors += resolves.summary()["error_count"]
                print(
                    f"[{now - start:7.0f} s] RSS {mb:.1f} MB, sent {n}, answered {len(inline.latencies)} inline "
                    f"{len(actions.latencies)} actions {len(resolves.latencies)} resolves, errors {errors}, "
                    f"in flight {len(pending)}",
                    file=log,
                    flush=True,
                )
    sent_for = loop.time() - start
    drain_start = loop.time()
    if pending:
        await asyncio.wait(set(pending), timeout=drain_timeout)
    drain_ms = (loop.time() - drain_start) * 1000
    unanswered = len(pending)
    for task in list(pending):  # never answered: stop waiting (the server is stopped after this)
        task.cancel()
    after = await session.stats()
    rss_end = rss_bytes(session.pid)
    rss_peak = max(rss_peak, rss_end)
    kinds = {"inline": inline.summary(), "action": actions.summary(), "resolve": resolves.summary()}
    errors = [e for k in kinds.values() for e in k["errors"]]
    return {
        "docs": docs,
        "rate": rate,
        "seconds": round(sent_for, 1),
        "requests": n,
        "answered": len(inline.latencies),
        "unanswered": unanswered,
        # inline answers by outcome (kept in the shape of earlier reports)
        "answers": {
            "items": inline.outcomes.get("items", 0),
            "null": inline.outcomes.get("null", 0),
            "cancelled": inline.outcomes.get("cancelled", 0),
            "error": inline.outcomes.get("error", 0),
        },
        "errors": errors[:5],
        "error_count": sum(k["error_count"] for k in kinds.values()),
        "latency_ms": kinds["inline"]["latency_ms"],
        "kinds": kinds,
        "engine": {
            "fills_started": after.engine_fills_started - before.engine_fills_started,
            "fills_completed": after.engine_fills_completed - before.engine_fills_completed,
            "cancelled": after.cancelled - before.cancelled,
            "failed": after.failed - before.failed,
            "cache_hits": after.cache_hits - before.cache_hits,
        },
        "backlog": {
            "queued_peak": queued_peak,
            "live_peak": live_peak,
            "queued_end": after.engine_queued,
            "drain_ms": round(drain_ms, 1),
        },
        "rss_mb": {
            "before": round(rss_before / MB, 1),
            "peak": round(rss_peak / MB, 1),
            "end": round(rss_end / MB, 1),
            "growth": round((rss_end - rss_before) / MB, 1),
            "timeline": samples,
            "levelling": levelling(samples, flat_mb),
        },
        "heap_mb": heap_summary(heap, flat_mb),
    }


def table(m: dict) -> str:
    lat = m["latency_ms"]
    rows = [
        ("documents / rate / seconds", f"{m['docs']} / {m['rate']:g} per s / {m['seconds']} s"),
        (
            "inline requests sent / answered / unanswered (all kinds)",
            f"{m['requests']} / {m['answered']} / {m['unanswered']}",
        ),
        (
            "answers: items / null / cancelled / error",
            "{items} / {null} / {cancelled} / {error}".format(**m["answers"]),
        ),
        (
            "latency p50 / p90 / p95 / p99 / max",
            " / ".join(str(lat.get(q, "-")) for q in ("p50", "p90", "p95", "p99", "max")) + " ms",
        ),
    ]
    for name, k in m.get("kinds", {}).items():
        if name == "inline" or not k["sent"]:
            continue
        outcomes = ", ".join(f"{o} {c}" for o, c in k["outcomes"].items()) or "none"
        q = k["latency_ms"]
        rows.append((f"{name}: sent / answered (outcomes)", f"{k['sent']} / {k['answered']} ({outcomes})"))
        rows.append(
            (f"{name} latency p50 / p90 / p99 / max", f"{q['p50']} / {q['p90']} / {q['p99']} / {q['max']} ms")
        )
    rows += [
        ("errors (all kinds)", str(m.get("error_count", m["answers"]["error"]))),
        (
            "engine fills started / completed",
            f"{m['engine']['fills_started']} / {m['engine']['fills_completed']}",
        ),
        (
            "server cancelled / failed / cache hits",
            "{cancelled} / {failed} / {cache_hits}".format(**m["engine"]),
        ),
        (
            "backlog: queued peak (live) / at end / drain",
            "{queued_peak} ({live_peak}) / {queued_end} / {drain_ms} ms".format(**m["backlog"]),
        ),
        ("server RSS before / peak / end", "{before} / {peak} / {end} MB".format(**m["rss_mb"])),
        ("RSS growth", f"{m['rss_mb']['growth']} MB"),
    ]
    for part, lev in m.get("heap_mb", {}).get("levelling", {}).items():
        rows.append(
            (
                f"C heap {part.replace('_', ' ')}: last sample / slope over the last half",
                f"{m['heap_mb']['timeline'][-1][1][part]} MB / {lev['slope_mb_per_min']} MB/min",
            )
        )
    lev = m["rss_mb"].get("levelling")
    if lev:
        verdict = "levels off" if lev["flat"] else "still growing"
        rows.append(
            (
                f"RSS slope over the last half (from {lev['last_half_from_s']} s, {lev['samples']} samples)",
                f"{lev['slope_mb_per_min']} MB/min = {lev['growth_last_half_mb']} MB: {verdict} "
                f"(flat: <= {lev['flat_mb']:g} MB)",
            )
        )
    width = max(len(r[0]) for r in rows)
    lines = [f"| {'measure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="dfim-soak-"))
    model = str(random_checkpoint(tmp / "ckpt")) if args.random else args.model
    settings = {
        "sampling": {"maxSteps": args.max_steps, "actionMaxSteps": args.max_steps},
        "telemetry": {"enabled": False},
    }
    seconds = args.seconds if args.seconds is not None else args.minutes * 60.0
    session = ServerSession()
    await session.start(model or "", tmp, init_options=settings)
    try:
        status = await session.wait_state(timeout=300)
        if status.state != "ready":
            print(f"server not ready: {status.message}", file=sys.stderr)
            return 1
        files = sorted(p for p in (ROOT / "fixtures").glob("example.*") if p.suffix in LANGUAGES)
        print(
            f"soak: {seconds / 60:g} min at {args.rate:g} requests/s over {args.docs} documents "
            f"(code actions every {args.action_every} ticks, one in {args.resolve_every} resolved), "
            f"RSS every {args.sample_s:g} s",
            file=sys.stderr,
        )
        started = time.time()
        m = await soak(
            session,
            files,
            args.docs,
            args.rate,
            seconds,
            drain_timeout=args.drain_timeout,
            action_every=args.action_every,
            resolve_every=args.resolve_every,
            revert_every=args.revert_every,
            sample_s=args.sample_s,
            flat_mb=args.flat_mb,
            log=sys.stderr,
        )
        m["wall_s"] = round(time.time() - started, 1)
    finally:
        await session.stop()
    load = os.getloadavg()
    m["machine"] = {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in load], "model": status.model}
    if args.csv:
        lines = []  # one heap sample beside each RSS sample
        for (t, v), (_, h) in zip(m["rss_mb"]["timeline"], m["heap_mb"]["timeline"], strict=True):
            h = h or {}
            lines.append(f"{t},{v},{h.get('in_use', '')},{h.get('free', '')},{h.get('mmapped', '')}\n")
        Path(args.csv).write_text(
            "seconds,rss_mb,heap_in_use_mb,heap_free_mb,heap_mmapped_mb\n" + "".join(lines), encoding="utf-8"
        )
    if args.json:
        print(json.dumps(m, indent=2))
    else:
        print(
            f"model {status.model} ({'random' if status.isRandom else 'trained'}), max steps {args.max_steps}, "
            f"{os.cpu_count()} cpus, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
        )
        print(table(m))
        print(plot(m["rss_mb"]["timeline"]))
    ok = (
        m["unanswered"] == 0
        and m["backlog"]["queued_end"] == 0
        and m["error_count"] == 0
        and m["rss_mb"]["levelling"]["flat"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--random", action="store_true", help="a random tiny checkpoint (plumbing only)")
    parser.add_argument("--docs", type=int, default=10, help="documents typed into, round robin")
    parser.add_argument(
        "--rate", type=float, default=20.0, help="edits (each with an inline request) per second"
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the load runs")
    parser.add_argument(
        "--seconds", type=float, default=None, help="how long, in seconds (overrides --minutes)"
    )
    parser.add_argument("--action-every", type=int, default=10, help="code actions every N ticks (0: none)")
    parser.add_argument(
        "--resolve-every", type=int, default=10, help="resolve one of every N code-action lists (0: none)"
    )
    parser.add_argument(
        "--revert-every", type=int, default=200, help="characters typed before an undo (0: never)"
    )
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between RSS samples")
    parser.add_argument("--flat-mb", type=float, default=10.0, help="growth over the last half still 'flat'")
    parser.add_argument(
        "--drain-timeout", type=float, default=120.0, help="seconds to wait for the last answers"
    )
    parser.add_argument("--max-steps", type=int, default=16)
    parser.add_argument("--csv", default=None, metavar="FILE", help="write the RSS samples (seconds,MB)")
    parser.add_argument("--json", action="store_true")
    sys.exit(asyncio.run(main(parser.parse_args())))
