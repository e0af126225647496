"""Tab-Tab round trip of `dfim serve` over stdio: an accept followed by a request at the new cursor.

    python scripts/bench_tabtab.py [--model PATH | --random] [--tries 20] [--think-ms 400] [--device cpu] [--cycling]

Starts the real server (result cache off, so that every first request fills), then for each try opens a fresh copy of `scripts/data/typing.py.txt` with the rest
of one line cut off (the user is writing it), asks for an inline completion at the end of what is left,
accepts the first item (a didChange inserting it, as an editor does), waits `--think-ms` (the user reading
the suggestion before pressing Tab) and asks again at the new cursor. It times that second request, from
sending it to its answer.

Two passes over the same lines: `inline.speculate` on (the answer comes from the fill started when the
suggestion was shown) and off (a fresh fill). It prints p50/p95 of each pass, split by how each second
request was answered: by a speculation already finished ("ready": the speculation held), by one it waited
for ("waited": the user was quicker than the fill), or by a fill of its own ("filled"); and how many answers
differ between the passes (they should not: the same state, the same settings). Issue 33's target: <= 30 ms
p50 where the speculation held.

`--cycling` counts instead the distinct items of an automatic and of an invoked request (triggerKind
Invoked, which should bring several to cycle through) at each cut line, and times both (a fresh document
each: the automatic request fills first, so the invoked one finds its context encoded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lsprotocol import types  # noqa: E402

from tests.server_helpers import Session, random_checkpoint  # noqa: E402

SOURCE = ROOT / "scripts" / "data" / "typing.py.txt"


def cut_lines(text: str, tries: int) -> list[tuple[str, int, int]]:
    """(document, line, character) for `tries` code lines spread over `text`, each with the second half of that
    line removed: the cursor at the end of what is left."""
    lines = text.split("\n")
    picks = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if len(stripped) < 16 or stripped.startswith(("#", '"', "'", "import", "from", "@")):
            continue
        picks.append(i)
    step = max(1, len(picks) // max(1, tries))
    out = []
    for i in picks[::step][:tries]:
        line = lines[i]
        cut = len(line) - len(line.lstrip()) + len(line.strip()) // 2
        doc = "\n".join(lines[:i] + [line[:cut]] + lines[i + 1 :])
        out.append((doc, i, cut))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


async def one_pass(session: Session, docs, speculate: bool, think: float, tag: str) -> dict:
    """Accept-then-request over `docs`: the round trips (ms) of the second requests, by how they were
    answered ("ready": by a finished speculation, "waited": by one still running, "filled": by a fill of
    their own), and their answers."""
    session.configure({"inline": {"speculate": speculate}})
    await asyncio.sleep(0.2)
    times: dict[str, list[float]] = {"ready": [], "waited": [], "filled": []}
    answers: list[str | None] = []
    before = await session.stats()
    for n, (doc, line, character) in enumerate(docs):
        uri = f"file:///bench/{tag}/{n}.py"
        session.open(uri, doc)
        first = await session.inline(uri, line, character)
        if first is None or not first.items:
            answers.append(None)
            session.client.text_document_did_close(
                types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
            )
            continue
        item = first.items[0]
        session.change(uri, item.insert_text, item.range)  # the accept
        await asyncio.sleep(think)
        end = item.range.start.character + len(item.insert_text.encode("utf-16-le")) // 2
        counts = await session.stats()
        start = time.perf_counter()
        second = await session.inline(uri, line, end)
        elapsed = (time.perf_counter() - start) * 1000
        now = await session.stats()
        if now.speculation_hits == counts.speculation_hits:
            times["filled"].append(elapsed)
        else:
            times["waited" if now.speculation_waits > counts.speculation_waits else "ready"].append(elapsed)
        answers.append(second.items[0].insert_text if second and second.items else "")
        session.client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
    after = await session.stats()
    counts = {
        name: getattr(after, name) - getattr(before, name)
        for name in ("speculations", "speculation_fills", "speculation_hits", "speculation_waits", "fills")
    }
    return {"times": times, "answers": answers, "counts": counts}


async def cycling_pass(session: Session, docs) -> dict:
    """Distinct items of an automatic and of an invoked request (triggerKind Invoked) at each cut line."""
    counts: dict[str, list[int]] = {"automatic": [], "invoked": []}
    times: dict[str, list[float]] = {"automatic": [], "invoked": []}
    for n, (doc, line, character) in enumerate(docs):
        uri = f"file:///bench/cycle/{n}.py"
        session.open(uri, doc)
        for kind, name in (
            (types.InlineCompletionTriggerKind.Automatic, "automatic"),
            (types.InlineCompletionTriggerKind.Invoked, "invoked"),
        ):
            start = time.perf_counter()
            result = await session.client.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(uri=uri),
                    position=types.Position(line=line, character=character),
                    context=types.InlineCompletionContext(trigger_kind=kind),
                )
            )
            times[name].append((time.perf_counter() - start) * 1000)
            counts[name].append(len({item.insert_text for item in result.items}) if result else 0)
    return {
        name: {
            "mean_items": round(statistics.mean(values), 2),
            "with_2_or_more": sum(v >= 2 for v in values),
            "none": sum(v == 0 for v in values),
            "p50_ms": round(statistics.median(times[name])),
            "p95_ms": round(sorted(times[name])[int(0.95 * (len(times[name]) - 1))]),
        }
        for name, values in counts.items()
    }


async def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="dfim-tabtab-"))
    model = str(random_checkpoint(tmp / "ckpt")) if args.random else args.model
    session = Session()
    await session.start(
        model or "",
        tmp,
        # no result cache: every first request fills, so the engine's context cache holds the state the
        # suggestion was shown in when the second request (or its speculation) fills, in both passes
        init_options={"telemetry": {"enabled": False}, "inline": {"cacheSize": 0}},
        args=("--device", args.device),
    )
    try:
        status = await session.wait_state(timeout=300)
        if status.state != "ready":
            print(f"the server is not ready: {status}")
            return 1
        docs = cut_lines(SOURCE.read_text(), args.tries)
        if args.cycling:
            print(
                json.dumps({"model": status.model, "tries": len(docs), **await cycling_pass(session, docs)})
            )
            return 0
        # warm up: the first fills load kernels and fill the context cache
        await one_pass(session, docs[:3], True, args.think_ms / 1000, "warm")
        passes = {}
        for speculate in (True, False):
            tag = "on" if speculate else "off"
            passes[tag] = await one_pass(session, docs, speculate, args.think_ms / 1000, tag)
    finally:
        await session.stop()
    report = {"model": status.model, "device": args.device, "tries": len(docs), "think_ms": args.think_ms}
    for tag, result in passes.items():
        report[tag] = {**result["counts"]}
        everything = [t for times in result["times"].values() for t in times]
        for name, times in [("all", everything), *result["times"].items()]:
            if times:
                report[tag][name] = {
                    "requests": len(times),
                    "p50_ms": round(statistics.median(times), 1),
                    "p95_ms": round(pct(times, 95), 1),
                }
    on, off = passes["on"]["answers"], passes["off"]["answers"]
    report["answers_differ"] = [
        {"try": n, "speculated": a, "fresh": b}
        for n, (a, b) in enumerate(zip(on, off, strict=True))
        if a != b
    ]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="", help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--random", action="store_true", help="a random tiny checkpoint (a smoke test)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--cycling", action="store_true", help="count the items of invoked requests instead")
    parser.add_argument(
        "--think-ms", type=float, default=400.0, help="wait between the accept and the request"
    )
    sys.exit(asyncio.run(main(parser.parse_args())))
