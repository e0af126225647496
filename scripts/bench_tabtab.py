"""Tab-Tab round trip of `dfim serve` over stdio: an accept followed by a request at the new cursor.

    python scripts/bench_tabtab.py [--model PATH | --random] [--tries 20] [--think-ms 400] [--device cpu]

Starts the real server, then for each try opens a fresh copy of `scripts/data/typing.py.txt` with the rest
of one line cut off (the user is writing it), asks for an inline completion at the end of what is left,
accepts the first item (a didChange inserting it, as an editor does), waits `--think-ms` (the user reading
the suggestion before pressing Tab) and asks again at the new cursor. It times that second request, from
sending it to its answer.

Two passes over the same lines: `inline.speculate` on (the answer comes from the fill started when the
suggestion was shown) and off (a fresh fill). It prints p50/p95 of each, how many second requests the
speculation answered (and how many of those had to wait for it to finish), and how many answers differ
between the passes (they should not: the same state, the same settings). Issue 33's target: <= 30 ms p50
with the speculation holding.
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
    """Accept-then-request over `docs`; the round trips (ms) and answers of the second requests."""
    session.configure({"inline": {"speculate": speculate}})
    await asyncio.sleep(0.2)
    times: list[float] = []
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
        start = time.perf_counter()
        second = await session.inline(uri, line, end)
        times.append((time.perf_counter() - start) * 1000)
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


async def main(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="dfim-tabtab-"))
    model = str(random_checkpoint(tmp / "ckpt")) if args.random else args.model
    session = Session()
    await session.start(
        model or "", tmp, init_options={"telemetry": {"enabled": False}}, args=("--device", args.device)
    )
    try:
        status = await session.wait_state(timeout=300)
        if status.state != "ready":
            print(f"the server is not ready: {status}")
            return 1
        docs = cut_lines(SOURCE.read_text(), args.tries)
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
        times = result["times"]
        report[tag] = {
            "requests": len(times),
            "p50_ms": round(statistics.median(times), 1) if times else None,
            "p95_ms": round(pct(times, 95), 1) if times else None,
            **result["counts"],
        }
    on, off = passes["on"]["answers"], passes["off"]["answers"]
    report["answers_differ"] = sum(a != b for a, b in zip(on, off, strict=True))
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
    parser.add_argument(
        "--think-ms", type=float, default=400.0, help="wait between the accept and the request"
    )
    sys.exit(asyncio.run(main(parser.parse_args())))
