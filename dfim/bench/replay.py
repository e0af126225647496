"""`dfim replay`: replay typing against the real language server and measure what inline completion saves.

    dfim replay FILE... [--git REPO --commits N] [--model PATH] [--trigger word|line|chars] [--out DIR]

The server runs as it does for an editor (`python -m dfim serve --model PATH` over stdio, driven by pygls's
LanguageClient). Each replayed *region* is text a person types into a document:
- a FILE is typed from an empty document, top to bottom;
- a commit of `--git REPO` contributes every run of added lines of every changed file with a known language:
  the document is the file after the commit minus the runs not typed yet, and the run is typed in place (so
  the code after it is the suffix the model sees).

Typing goes forward character by character (sent as incremental `didChange`s, one per stretch between two
trigger points). At every trigger point the client sends `textDocument/inlineCompletion` and judges the
first item against what the person types next:
- **full accept**: the whole suggestion is what comes next (an item that also rewrites the rest of the line
  counts when that rest comes back unchanged); the cursor jumps past it;
- **partial accept**: otherwise, its longest common prefix with what comes next, if it holds at least
  `--min-partial` characters other than whitespace (an editor's accept-word/accept-line, counted by
  characters; indentation alone is chance agreement, as an editor indents by itself);
- otherwise rejected, and typing goes on.
After an accept the next request goes out at once. Model time comes from the server (`dfim/stats`: the
engine's own latency of the fill a request caused; cache hits and typed-ahead reuse cost none).

Reported (DESIGN §6): acceptance rate = accepted / shown; chars saved = accepted chars / chars of the
replayed text; p50/p95 round-trip latency of the requests; latency per accepted edit = total model time /
accepted suggestions (rejected requests included). JSON (`report.json`) and markdown (`summary.md`).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from dfim.bench.lsp_client import Client, get_field, utf16_offset, utf16_position
from dfim.bench.replay_gate import gate_markdown, gate_summary, read_verdict
from dfim.engine.evaluation import metrics
from dfim.engine.progress import Progress
from dfim.server.options import GateOptions

TRIGGERS = ("word", "line", "chars")
IDENT = re.compile(r"\w")


@dataclass
class Region:
    """Text typed into one document: `before + typed + after` is the document once it is all typed."""

    source: str  # file path, or `commit:path:line` for a git run
    path: str  # file name (for the URI and the language)
    before: str
    typed: str
    after: str


@dataclass
class ReplayOptions:
    trigger: str = "word"  # word: after every non-identifier character; line: at each line's first non-blank
    every: int = 8  # characters between requests for trigger=chars
    min_partial: int = 3  # shorter common prefixes are chance agreement (a space, a bracket), not an accept
    max_chars: int = 2000  # of each region; the rest is dropped (keeps a replay of big commits bounded)
    # The confidence gate (dfim.server.gate). Not live: the server's gate is off, every suggestion is shown
    # and scored, and the report tells what a gate of this measure and threshold would have hidden (on the
    # same typing). Live: the server hides them, as for a user, and the typing follows what it showed.
    gate_live: bool = False
    gate_measure: str = field(default_factory=lambda: GateOptions().measure)  # the server's defaults
    gate_threshold: float = field(default_factory=lambda: GateOptions().threshold)


@dataclass
class RequestRecord:
    """What one inline request saw and what came of it (report.json: a region's `request_log`)."""

    offset: int  # characters of the region typed when the request went out
    line: int  # the cursor's line in the document (0-based, as LSP)
    character: int  # the cursor's column, in UTF-16 units
    ms: float  # round trip
    model_ms: float | None  # engine time the request caused; None when the server answered without the model
    shown: str  # the first item's text ("" when nothing was shown)
    verdict: str  # "full", "partial", "rejected" or "none" (nothing shown)
    accepted_chars: int = 0
    fills: int = 0  # engine fills the request ran (2 or more when the server asked again)
    encoded_tokens: int = 0  # context tokens the encoder ran for them (the rest came from its cache)
    gate_score: float | None = None  # the gate's measure of the suggestion (None: not scored)
    confidence: dict[str, float] | None = None  # the fill's summary (dfim.engine.api.FillConfidence)
    gated: bool = False  # the server's gate hid it (live gate only)


@dataclass
class RegionStats:
    source: str
    chars: int = 0  # characters of the replayed text (what the person would type without the tool)
    requests: int = 0
    shown: int = 0  # requests that returned a non-empty suggestion
    full_accepts: int = 0
    partial_accepts: int = 0
    accepted_chars: int = 0
    model_fills: int = 0  # requests the engine ran a fill for
    model_ms: float = 0.0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)  # round trip of every request
    model_latencies_ms: list[float] = field(default_factory=list)
    request_log: list[RequestRecord] = field(default_factory=list)  # one per request, in order

    @property
    def accepted(self) -> int:
        return self.full_accepts + self.partial_accepts


# ----------------------------------------------------------------------------- regions


def normalize(text: str) -> str:
    """LSP counts \\r\\n, \\r and \\n as line ends; replay with \\n only so offsets stay simple."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def file_region(path: str | os.PathLike) -> Region:
    """A file typed from an empty document. InputError (the line `dfim replay` prints) for a file `dfim fill`
    would refuse: missing, empty, binary, not UTF-8, or of an unknown language."""
    from dfim.commands.checks import InputError, read_text_file
    from dfim.server.languages import EXTENSIONS, language_of_path

    path = Path(path)
    text = normalize(read_text_file(path, "dfim replay"))
    if language_of_path(path.name) is None:
        kind = f"'{path.suffix}'" if path.suffix else "without an extension"
        known = " ".join(sorted(EXTENSIONS))
        raise InputError(f"{path}: unknown file type {kind} (dfim replay types source files: {known})")
    return Region(source=str(path), path=path.name, before="", typed=text, after="")


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted line indices -> [start, end) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n:
            runs[-1] = (runs[-1][0], n + 1)
        else:
            runs.append((n, n + 1))
    return runs


def added_lines(diff: str) -> dict[str, list[int]]:
    """`git show -U0` output -> {path: sorted 0-based indices of added lines in the new file}."""
    out: dict[str, list[int]] = {}
    current: str | None = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            name = line[4:].strip()
            current = name[2:] if name.startswith("b/") else None  # /dev/null: a deleted file
        elif line.startswith("@@") and current is not None:
            match = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", line)
            if match:
                start, count = int(match.group(1)), int(match.group(2) or 1)
                out.setdefault(current, []).extend(range(start - 1, start - 1 + count))
    return {k: sorted(set(v)) for k, v in out.items() if v}


def regions_from_lines(source: str, path: str, text: str, added: list[int], max_chars: int) -> list[Region]:
    """One region per run of added lines; runs after it are not in the document yet, runs before it are."""
    lines = normalize(text).splitlines(keepends=True)
    runs = [(s, min(e, len(lines))) for s, e in _runs([i for i in added if i < len(lines)])]
    regions = []
    for i, (start, end) in enumerate(runs):
        later = {n for s, e in runs[i + 1 :] for n in range(s, e)}
        typed = "".join(lines[start:end])[:max_chars]
        if not typed.strip():
            continue
        after = "".join(line for n, line in enumerate(lines[end:], end) if n not in later)
        regions.append(Region(f"{source}:{start + 1}", path, "".join(lines[:start]), typed, after))
    return regions


class GitError(Exception):
    """A git command failed; the message is the last line git printed."""


def git(repo: str, *args: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", repo, *args], check=True, capture_output=True, text=True, errors="replace"
        ).stdout
    except subprocess.CalledProcessError as e:
        detail = (e.stderr or "").strip().splitlines()
        raise GitError(detail[-1] if detail else str(e)) from None


def check_git(repo: str, rev: str) -> None:
    """`repo` is a git work tree (or repository) and `rev` names a commit in it; InputError otherwise."""
    from dfim.commands.checks import InputError, existing_dir

    existing_dir(repo, "--git")

    def ok(*args: str) -> bool:
        try:
            done = subprocess.run(
                ["git", "-C", repo, *args], capture_output=True, text=True, errors="replace"
            )
        except FileNotFoundError:
            raise InputError("--git: the `git` command is not installed") from None
        return done.returncode == 0

    if not ok("rev-parse", "--git-dir"):
        raise InputError(f"--git {repo}: not a git repository")
    if not ok("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"):
        raise InputError(f"--rev {rev}: unknown revision in {repo} (or a repository without commits)")


def git_regions(repo: str, commits: int, rev: str, max_chars: int) -> list[Region]:
    """Runs of added lines of the last `commits` non-merge commits up to `rev`, files of known languages only."""
    from dfim.server.languages import language_for

    regions: list[Region] = []
    for commit in git(repo, "log", "--no-merges", f"-n{commits}", "--format=%H", rev).split():
        diff = git(repo, "show", "--format=", "--unified=0", "--no-color", "--no-ext-diff", commit)
        for path, added in added_lines(diff).items():
            if language_for(None, path) is None:
                continue
            try:
                raw = subprocess.run(
                    ["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True
                ).stdout
                text = raw.decode("utf-8")
            except (subprocess.CalledProcessError, UnicodeDecodeError):
                continue  # binary or not in the tree
            regions += regions_from_lines(f"{commit[:10]}:{path}", Path(path).name, text, added, max_chars)
    return regions


# ----------------------------------------------------------------------------- judging a suggestion


def trigger_points(typed: str, trigger: str, every: int = 8) -> list[int]:
    """Cursor positions (0 <= p < len) where the client asks for a suggestion."""
    points = []
    for p in range(len(typed)):
        if trigger == "chars":
            ok = p % max(1, every) == 0
        elif trigger == "line":
            line_start = typed.rfind("\n", 0, p) + 1
            ok = typed[line_start:p].strip() == "" and not typed[p].isspace()
        else:  # word: after a non-identifier character, but not inside a run of indentation
            ok = p == 0 or (
                not IDENT.match(typed[p - 1]) and not (typed[p - 1] in " \t" and typed[p] in " \t")
            )
        if ok:
            points.append(p)
    return points


def judge(doc: str, cursor: int, start: int, end: int, insert: str, remaining: str, min_partial: int):
    """("full" | "partial" | "rejected", accepted characters) of the edit doc[start:end] = insert."""
    if start > cursor or end < cursor:
        return "rejected", 0
    head = doc[start:cursor]
    if not insert.startswith(head):
        return "rejected", 0  # it would rewrite what was already typed
    proposal, tail = insert[len(head) :], doc[cursor:end]
    if proposal.endswith(tail):
        core = proposal[: len(proposal) - len(tail)]
        if core and remaining.startswith(core):
            return "full", len(core)
    common = len(os.path.commonprefix([proposal, remaining]))
    # Whitespace does not count towards min_partial: an editor indents a new line by itself, so a suggestion
    # that shares only the indentation with what comes next agreed by chance. An empty accept would resend
    # the same request forever, hence at least one character.
    if common >= 1 and len("".join(remaining[:common].split())) >= min_partial:
        return "partial", common
    return "rejected", 0


# ----------------------------------------------------------------------------- the client


# ----------------------------------------------------------------------------- the replay


async def replay_region(client: Client, region: Region, uri: str, opts: ReplayOptions) -> RegionStats:
    from dfim.server.languages import language_for

    typed = region.typed[: opts.max_chars]
    stats = RegionStats(source=region.source, chars=len(typed))
    points = trigger_points(typed, opts.trigger, opts.every)
    client.open(uri, region.before + region.after, language_for(None, region.path) or "plaintext")
    before_stats = await client.stats()
    fills_done = get_field(before_stats, "engine_fills_completed") or 0
    model_ms_seen = float(get_field(before_stats, "model_ms") or 0.0)  # inline engine time so far
    encoded_seen = get_field(before_stats, "encoded_tokens") or 0
    gate_seen = get_field(get_field(before_stats, "gate"), "seq") or 0
    p, force = 0, True  # a request goes out on opening and right after every accept
    try:
        while p < len(typed):
            q = p if force else next((x for x in points if x > p), None)
            force = False
            doc = region.before + typed[:p] + region.after
            if q is None:
                break  # the rest is typed without another request
            if q > p:
                client.insert(uri, doc, len(region.before) + p, typed[p:q])
                p = q
                doc = region.before + typed[:p] + region.after
            cursor = len(region.before) + p
            stats.requests += 1
            started = time.perf_counter()
            try:
                result = await client.inline(uri, doc, cursor)
            except Exception:  # a failed request is a request that showed nothing
                result = None
                stats.errors += 1
            stats.latencies_ms.append((time.perf_counter() - started) * 1000.0)
            line, character = utf16_position(doc, cursor)
            record = RequestRecord(p, line, character, round(stats.latencies_ms[-1], 1), None, "", "none")
            stats.request_log.append(record)
            server = await client.stats()
            done = get_field(server, "engine_fills_completed") or 0
            if done > fills_done:  # the model ran for this request (twice when the server retried)
                spent = float(get_field(server, "model_ms") or 0.0)
                latency = spent - model_ms_seen
                stats.model_fills += done - fills_done
                stats.model_ms += latency
                stats.model_latencies_ms.append(latency)
                record.model_ms, record.fills = round(latency, 1), done - fills_done
                encoded = get_field(server, "encoded_tokens") or 0
                record.encoded_tokens, encoded_seen = encoded - encoded_seen, encoded
                fills_done, model_ms_seen = done, spent
            gate_seen = read_verdict(server, uri, gate_seen, record)
            items = list(get_field(result, "items") or []) if result is not None else []
            insert = get_field(items[0], "insert_text") if items else None
            insert = insert if isinstance(insert, str) else get_field(insert, "value")
            if not insert:
                continue
            stats.shown += 1
            rng = get_field(items[0], "range")
            if rng is None:
                start = end = cursor
            else:
                start = utf16_offset(doc, rng.start.line, rng.start.character)
                end = utf16_offset(doc, rng.end.line, rng.end.character)
            verdict, chars = judge(doc, cursor, start, end, insert, typed[p:], opts.min_partial)
            record.shown, record.verdict, record.accepted_chars = insert, verdict, chars
            if verdict == "rejected":
                continue
            stats.full_accepts += verdict == "full"
            stats.partial_accepts += verdict == "partial"
            stats.accepted_chars += chars
            client.insert(uri, doc, cursor, typed[p : p + chars])  # the same document the accept produces
            p += chars
            force = True
    finally:
        client.close(uri)
    return stats


def summarize(regions: list[RegionStats]) -> dict[str, Any]:
    chars = sum(r.chars for r in regions)
    shown = sum(r.shown for r in regions)
    accepted = sum(r.accepted for r in regions)
    model_ms = sum(r.model_ms for r in regions)
    latencies = [x for r in regions for x in r.latencies_ms]
    model_latencies = [x for r in regions for x in r.model_latencies_ms]
    return {
        "regions": len(regions),
        "chars": chars,
        "requests": sum(r.requests for r in regions),
        "shown": shown,
        "accepted": accepted,
        "full_accepts": sum(r.full_accepts for r in regions),
        "partial_accepts": sum(r.partial_accepts for r in regions),
        "accepted_chars": sum(r.accepted_chars for r in regions),
        "acceptance_rate": accepted / shown if shown else None,
        "chars_saved": sum(r.accepted_chars for r in regions) / chars if chars else None,
        "model_fills": sum(r.model_fills for r in regions),
        "model_ms_total": round(model_ms, 1),
        "errors": sum(r.errors for r in regions),
        "latency_p50_ms": metrics.percentile(latencies, 50) if latencies else None,
        "latency_p95_ms": metrics.percentile(latencies, 95) if latencies else None,
        "model_latency_p50_ms": metrics.percentile(model_latencies, 50) if model_latencies else None,
        "model_latency_p95_ms": metrics.percentile(model_latencies, 95) if model_latencies else None,
        "latency_per_accepted_ms": model_ms / accepted if accepted else None,
        "wall_per_accepted_ms": sum(latencies) / accepted if accepted else None,
    }


async def replay(
    regions: list[Region],
    *,
    model: str = "",
    device: str = "cpu",
    options: ReplayOptions | None = None,
    server_settings: dict | None = None,
    progress: TextIO | None = None,
) -> dict[str, Any]:
    """Start a server, replay every region, stop it; the report's `summary`, `regions` and `server`."""
    options = options or ReplayOptions()
    gate = {
        "enabled": options.gate_live,
        "measure": options.gate_measure,
        "threshold": options.gate_threshold,
    }
    init = {"telemetry": {"enabled": False}, **(server_settings or {})}
    init["inline"] = {**init.get("inline", {}), "gate": gate}
    client = Client()
    with tempfile.TemporaryDirectory(prefix="dfim-replay-") as data_dir:
        try:
            ready = await client.start(model, device, init, data_dir)
            if get_field(ready, "state") != "ready":
                raise RuntimeError(f"the server could not load the model: {get_field(ready, 'message')}")
            results = []
            bar = Progress(len(regions), "replaying", unit="regions", stream=progress, enabled=bool(progress))
            for i, region in enumerate(regions):
                uri = f"file:///dfim-replay/{i}/{region.path}"
                results.append(await replay_region(client, region, uri, options))
                s = results[-1]
                bar.update(
                    1, f"{region.source}: {s.accepted} of {s.shown} shown accepted ({s.requests} requests)"
                )
            bar.close()
            server = await client.stats()
            await client.stop()
        finally:
            await client.reap()  # any way out (an error, Ctrl-C, SIGTERM) leaves no `dfim serve` behind
    rows = []
    for r in results:
        row = asdict(r)
        row["accepted"] = r.accepted
        row["latencies_ms"] = [round(x, 1) for x in r.latencies_ms]
        row["model_latencies_ms"] = [round(x, 1) for x in r.model_latencies_ms]
        rows.append(row)
    server_info = {
        "model": get_field(ready, "model"),
        "is_random": get_field(ready, "isRandom"),
        "device": get_field(ready, "device"),
        "settings": init,  # what the replay told the server (its defaults fill the rest)
        "counters": {
            k: get_field(server, k)
            for k in ("fills", "completed", "cancelled", "failed", "cache_hits", "typed_ahead")
        },
    }
    return {
        "summary": summarize(results),
        "gate": gate_summary(results, options),
        "regions": rows,
        "server": server_info,
        "options": asdict(options),
    }


def markdown(report: dict[str, Any]) -> str:
    s, meta = report["summary"], report["meta"]

    def f(v: Any, scale: float = 1.0, digits: int = 1) -> str:
        return "-" if v is None else f"{v * scale:.{digits}f}"

    model = report["server"]["model"] or "default"
    random_note = " (random weights)" if report["server"]["is_random"] else ""
    lines = [
        f"# dfim replay: {s['regions']} region{'s' * (s['regions'] != 1)}, {s['chars']} chars, model {model}{random_note}",
        "",
        "| requests | shown | accepted (full/partial) | acceptance | chars saved | p50 ms | p95 ms "
        "| model p50 ms | model ms / accepted |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {s['requests']} | {s['shown']} | {s['accepted']} ({s['full_accepts']}/{s['partial_accepts']}) "
        f"| {f(s['acceptance_rate'], 100)}% | {f(s['chars_saved'], 100)}% | {f(s['latency_p50_ms'])} "
        f"| {f(s['latency_p95_ms'])} | {f(s['model_latency_p50_ms'])} | {f(s['latency_per_accepted_ms'])} |",
        "",
        "shown: requests that showed a completion; acceptance: accepted / shown; chars saved: accepted "
        f"chars / typed chars; p50/p95 ms: request to answer as the editor waits (n = {s['requests']}); "
        "model p50 ms: one model fill; model ms / accepted: all model time over the accepted completions.",
        "",
        f"trigger: {report['options']['trigger']}; min partial accept: {report['options']['min_partial']} chars; "
        f"model fills: {s['model_fills']} ({f(s['model_ms_total'])} ms); errors: {s['errors']}",
        "",
        f"command: `{meta['command']}`",
        "",
    ]
    if "gate" in report:
        lines[-2:-2] = gate_markdown(report["gate"]) + [""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- command line


async def cancelled_by_sigterm(work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """`work`, cancelled by SIGTERM as asyncio.run cancels on Ctrl-C: it unwinds at an await, its `finally`
    stops the server child. (A handler raising KeyboardInterrupt wherever the signal landed sometimes hit
    pygls's reader task instead, which left a traceback of a task exception never retrieved.)"""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
