"""Soak test of `dfim serve` over stdio: many documents, a steady stream of typing and inline requests.

    python scripts/soak.py [--model PATH | --random] [--docs 10] [--rate 50] [--seconds 60] [--json]

Opens `--docs` documents (fixture files) and, `--rate` times a second, types one character into the next
document (round robin, an incremental change) and asks for an inline completion at the new cursor, the way
an editor does while someone types; every 4th request is also withdrawn with `$/cancelRequest` shortly after
(a client that gave up). Nothing waits for the answers. Prints a small table:

- latency p50/p95/max of every answer (a completion, `null` for a superseded request, or an error);
- answers by kind, requests never answered, engine fills started/completed/cancelled;
- backlog: the largest `engine_queued` (fills handed to the engine worker, not yet out) seen during the run
  and, in brackets, `engine_queued_live` (of those, the ones not superseded or cancelled: at most one per
  document when cancelled work is freed), how long the last answers took to arrive after the last request,
  and what is left queued after that;
- server RSS before the load, at its peak and at the end (growth = end - before).

Targets (issue 8): growth <= 100 MB, no backlog (nothing queued at the end, the drain within a few fills),
every request answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lsprotocol import types  # noqa: E402
from pygls.exceptions import JsonRpcException  # noqa: E402

from tests.robustness_helpers import ServerSession, rss_bytes  # noqa: E402
from tests.server_helpers import random_checkpoint  # noqa: E402

LANGUAGES = {".py": "python", ".js": "javascript", ".ts": "typescript", ".go": "go", ".rs": "rust"}
MB = 2**20


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))]


class Typist:
    """One document being typed into: it re-types `source` (a fixture's text) at the end of the document."""

    def __init__(self, uri: str, text: str, source: str) -> None:
        self.uri = uri
        self.text = text
        self.source = source or "x = 1\n"
        self.next = 0
        lines = text.split("\n")
        self.line, self.character = len(lines) - 1, len(lines[-1])  # the cursor, in UTF-16 units

    def type_one(self, session: ServerSession) -> None:
        ch = self.source[self.next % len(self.source)]
        self.next += 1
        pos = types.Position(self.line, self.character)
        session.change(self.uri, ch, types.Range(start=pos, end=pos))
        self.text += ch
        if ch == "\n":
            self.line, self.character = self.line + 1, 0
        else:
            self.character += 2 if ord(ch) > 0xFFFF else 1


async def soak(
    session: ServerSession,
    files: list[Path],
    docs: int = 10,
    rate: float = 50.0,
    seconds: float = 60.0,
    drain_timeout: float = 60.0,
) -> dict:
    """Run the load against a started, ready session; returns the measurements."""
    loop = asyncio.get_running_loop()
    typists = []
    for i in range(docs):
        path = files[i % len(files)]
        source = path.read_text(encoding="utf-8")
        uri = f"file:///soak/doc{i}{path.suffix}"
        session.open(uri, source, LANGUAGES.get(path.suffix, "plaintext"))
        typists.append(Typist(uri, source, source))
    await session.stats()  # the opens are processed
    before = await session.stats()
    rss_before = rss_bytes(session.pid)
    rss_peak, queued_peak, live_peak = rss_before, 0, 0
    latencies: list[float] = []
    kinds = {"items": 0, "null": 0, "cancelled": 0, "error": 0}
    errors: list[str] = []
    pending: set[asyncio.Future] = set()
    timeline: list[float] = []  # server RSS in MB, once a second

    async def one(typist: Typist, n: int) -> None:
        msg_id = f"soak-{n}"
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=typist.uri),
            position=types.Position(typist.line, typist.character),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        )
        t0 = loop.time()
        future = asyncio.wrap_future(
            session.client.protocol.send_request(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id)
        )
        if n % 4 == 3:  # a client that gives up on this one

            async def withdraw() -> None:
                await asyncio.sleep(0.02)
                if not future.done():
                    session.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))

            loop.create_task(withdraw())
        try:
            result = await future
            kinds["items" if result is not None and result.items else "null"] += 1
        except JsonRpcException as exc:
            if exc.code == -32800:
                kinds["cancelled"] += 1
            else:
                kinds["error"] += 1
                errors.append(f"{exc.code}: {exc.message}")
        latencies.append((loop.time() - t0) * 1000)

    start = loop.time()
    next_sample = start + 1.0
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
        task = loop.create_task(one(typist, n))
        pending.add(task)
        task.add_done_callback(pending.discard)
        n += 1
        if loop.time() >= next_sample:  # once a second: memory and backlog (answered between requests)
            next_sample += 1.0
            timeline.append(round(rss_bytes(session.pid) / MB, 1))
            rss_peak = max(rss_peak, timeline[-1] * MB)
            stats_task = loop.create_task(session.stats())

            def sampled(t: asyncio.Task) -> None:
                nonlocal queued_peak, live_peak
                if not t.cancelled() and t.exception() is None:
                    queued_peak = max(queued_peak, t.result().engine_queued)
                    live_peak = max(live_peak, t.result().engine_queued_live)

            stats_task.add_done_callback(sampled)
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
    return {
        "docs": docs,
        "rate": rate,
        "seconds": round(sent_for, 1),
        "requests": n,
        "answered": len(latencies),
        "unanswered": unanswered,
        "answers": kinds,
        "errors": errors[:5],
        "latency_ms": {
            "p50": round(pct(latencies, 50), 1),
            "p95": round(pct(latencies, 95), 1),
            "max": round(max(latencies, default=float("nan")), 1),
        },
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
            "timeline": timeline,
        },
    }


def table(m: dict) -> str:
    rows = [
        ("documents / rate / seconds", f"{m['docs']} / {m['rate']:g} per s / {m['seconds']} s"),
        ("requests sent / answered / unanswered", f"{m['requests']} / {m['answered']} / {m['unanswered']}"),
        (
            "answers: items / null / cancelled / error",
            "{items} / {null} / {cancelled} / {error}".format(**m["answers"]),
        ),
        ("latency p50 / p95 / max", "{p50} / {p95} / {max} ms".format(**m["latency_ms"])),
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
    width = max(len(r[0]) for r in rows)
    lines = [f"| {'measure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="dfim-soak-"))
    model = str(random_checkpoint(tmp / "ckpt")) if args.random else args.model
    settings = {"sampling": {"maxSteps": args.max_steps}, "telemetry": {"enabled": False}}
    session = ServerSession()
    await session.start(model or "", tmp, init_options=settings)
    try:
        status = await session.wait_state(timeout=300)
        if status.state != "ready":
            print(f"server not ready: {status.message}", file=sys.stderr)
            return 1
        files = sorted(p for p in (ROOT / "fixtures").glob("example.*") if p.suffix in LANGUAGES)
        m = await soak(session, files, args.docs, args.rate, args.seconds)
    finally:
        await session.stop()
    load = os.getloadavg()
    m["machine"] = {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in load], "model": status.model}
    if args.json:
        print(json.dumps(m, indent=2))
    else:
        print(
            f"model {status.model} ({'random' if status.isRandom else 'trained'}), max steps {args.max_steps}, "
            f"{os.cpu_count()} cpus, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
        )
        print(table(m))
    ok = m["unanswered"] == 0 and m["backlog"]["queued_end"] == 0 and m["rss_mb"]["growth"] <= 100
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--random", action="store_true", help="a random tiny checkpoint (plumbing only)")
    parser.add_argument("--docs", type=int, default=10)
    parser.add_argument("--rate", type=float, default=50.0, help="inline requests per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-steps", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    sys.exit(asyncio.run(main(parser.parse_args())))
