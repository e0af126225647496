"""Model-free check of the server's own chains: pass each spot's *correct* answer through them, as if the
model had written it, and count what the chains break.

Every kind of spot is cut from real files (held-out projects, say): the document a user would have, a
cursor, and the original file. The ideal raw fill is what, put between the request's prefix and suffix,
gives the original back. A correct pipeline (context, post-processing chain, the edit the inline item or
code action makes) turns it into an edit that restores the original; anything else is counted, with the
names of the rules that changed it (`State.trace`). Kinds:

- `line` / `line@col0`: the rest of a line after its indentation (or the whole line at column 0);
- `line-closed`: a line's code up to the closers it ends with (`)`, `]`, `"`, `;` ...), which stay after the
  cursor as an editor that closes brackets leaves them; the server pins them after the hole;
- `ml-eol` / `ml-blank` / `ml-mid`: several lines (a multi-line inline fill) after a line that opens a
  block, on a blank line there, or in the middle of a block;
- `fh-hole` / `fh-empty` / `fh-braces`: *Fill the hole* on a function body replaced by a hole marker
  (`pass`, `// TODO`, `todo!()`), by a blank line, or on `{}`;
- `cf-blank` / `cf-eol`: *Complete the function body* with the body's last lines missing, the cursor on
  a blank line or at the end of the last line kept.

    python scripts/postprocess_oracle.py --source DIR --glob '**/*.cc' --language cpp [--kinds ml-eol,cf-eol]
        [--limit 200] [--examples 3] [--out FILE.json]

No model runs, so it takes seconds; the numbers in `docs/bench/postprocess-2026-11-29/` came from it.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import dev_own_code  # noqa: E402

from dfim.engine.api import SamplerSettings  # noqa: E402
from dfim.engine.layout import code_of_line, leading_ws, opens_block  # noqa: E402
from dfim.server import actions  # noqa: E402
from dfim.server.context import block_lead_for, build_context, single_line  # noqa: E402
from dfim.server.inline_plan import fill_request, fit_body_fill, one_line_edit, strip_pinned_tail  # noqa: E402
from dfim.server.languages import FUNCTION_TYPES, Source  # noqa: E402
from dfim.server.options import Options  # noqa: E402
from dfim.server.post_context import post_context  # noqa: E402
from dfim.server.postprocess import hole_chain, inline_chain  # noqa: E402

KINDS = ("line", "line@col0", "line-closed", "ml-eol", "ml-blank", "ml-mid", "fh-hole", "fh-empty", "fh-braces", "cf-blank",
         "cf-eol")  # fmt: skip
SEVERAL_CHARS = 200  # a 64-token canvas holds about this much code
ACTION_CHARS = 380  # a 128-token canvas
HOLE = {"python": "pass", "rust": "todo!()"}  # elsewhere `// TODO`


@dataclass
class Spot:
    how: str  # "line", "lines" (inline, several lines), or an action's name
    orig: str  # the file as it was
    doc: str  # the document the user has
    cursor: int


@dataclass
class Outcome:
    verdict: str  # "ok", or what went wrong and which rules changed the fill
    want: str | None = None  # the ideal raw fill
    got: str | None = None  # what the chain made of it


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


# --- spots -------------------------------------------------------------------------------------------------


def line_spots(root: Path, globs: tuple[str, ...], limit: int, col0: bool) -> list[Spot]:
    out = []
    for p in dev_own_code.problems(kind="line", root=root, patterns=globs)[:limit]:
        prefix, suffix, want = p["prefix"], p["suffix"], p["want"]
        orig = prefix + want + suffix
        if col0:  # the cursor at column 0, the indentation part of what is missing
            prefix = prefix.rstrip(" \t")
        out.append(Spot("line", orig, prefix + suffix, len(prefix)))
    return out


def closed_line_spots(root: Path, globs: tuple[str, ...], limit: int) -> list[Spot]:
    """After some of a line's code, the rest of it cut before the run of closers and punctuation it ends
    with, which stays in the document after the cursor (lines that end with none are left out)."""
    out = []
    for p in dev_own_code.problems(kind="midline", root=root, patterns=globs):  # some of the line typed
        prefix, want, suffix = p["prefix"], p["want"], p["suffix"]
        code = want.rstrip()
        rest = len(code) - len(code.rstrip(dev_own_code.CLOSERS))
        if not rest or rest == len(code):
            continue
        cut = len(code) - rest
        out.append(Spot("line", prefix + want + suffix, prefix + want[cut:] + suffix, len(prefix)))
        if len(out) >= limit:
            break
    return out


def several_line_spots(
    files: list[str], texts: dict[str, str], lang: str, variant: str, limit: int
) -> list[Spot]:
    """eol / blank: a block's first lines after the line that opens it; mid: statements inside a block."""
    rng = random.Random(11)
    found = []
    for path in files:
        lines = texts[path].split("\n")
        for i, line in enumerate(lines):
            if i < 5 or len(line) > 150 or not line.strip():
                continue
            if variant in ("eol", "blank"):
                if not opens_block(line, lang):
                    continue
                body, total = [], 0
                for nxt in lines[i + 1 : i + 7]:
                    if (nxt.strip() and indent_of(nxt) <= indent_of(line)) or total + len(
                        nxt
                    ) + 1 > SEVERAL_CHARS:
                        break
                    body.append(nxt)
                    total += len(nxt) + 1
                while body and not body[-1].strip():
                    body.pop()
                if len(body) < 2 or not body[0].strip():
                    continue
                found.append((path, i + 1, i + 1 + len(body)))
            else:
                prev = lines[i - 1]
                if not prev.strip() or indent_of(prev) != indent_of(line) or opens_block(prev, lang):
                    continue
                if indent_of(line) == 0 or code_of_line(line, lang).strip()[:1] in ")]}":
                    continue
                if line.strip().startswith(("//", "#", "/*", "*")):
                    continue
                j, total = i, 0
                while (
                    j < len(lines)
                    and j - i < 6
                    and lines[j].strip()
                    and indent_of(lines[j]) >= indent_of(line)
                ):
                    closes = code_of_line(lines[j], lang).strip()[:1] in ")]}"
                    if (j > i and closes and indent_of(lines[j]) == indent_of(line)) or total + len(
                        lines[j]
                    ) > SEVERAL_CHARS:
                        break
                    total += len(lines[j]) + 1
                    j += 1
                if j - i >= 2:
                    found.append((path, i, j))
    rng.shuffle(found)
    out = []
    for path, s, e in found[:limit]:
        text = texts[path]
        lines = text.split("\n")
        before, after = "\n".join(lines[:s]), "\n".join(lines[e:])
        if variant == "eol":
            out.append(Spot("lines", text, before + "\n" + after, len(before)))
        else:
            indent = leading_ws(lines[s])
            out.append(
                Spot("lines", text, before + "\n" + indent + "\n" + after, len(before) + 1 + len(indent))
            )
    return out


def function_bodies(files: list[str], texts: dict[str, str], lang: str) -> list[tuple[str, int, int, int]]:
    """(path, first body line, last body line, header line) of functions whose body starts a line of its own
    (brace bodies: `{` ends its line and `}` starts its own), up to ACTION_CHARS."""
    found = []
    for path in files:
        text = texts[path]
        src = Source(text, lang)
        if src.tree is None:
            continue
        lines = text.split("\n")
        stack = [src.tree.root_node]
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            body = node.child_by_field_name("body") if node.is_named and node.type in FUNCTION_TYPES else None
            if body is None:
                continue
            bs, be = src.span(body)
            if text[bs] == "{":
                if text[be - 1] != "}" or text[bs + 1 : line_end(text, bs)].strip():
                    continue
                if text[text.rfind("\n", 0, be - 1) + 1 : be - 1].strip():
                    continue
                first, last = text.count("\n", 0, bs) + 1, text.count("\n", 0, be - 1) - 1
            else:
                if text[text.rfind("\n", 0, bs) + 1 : bs].strip():
                    continue  # the body on the header's line
                first, last = text.count("\n", 0, bs), text.count("\n", 0, be)
            body_lines = lines[first : last + 1]
            if (
                last >= first
                and body_lines[0].strip()
                and sum(len(x) + 1 for x in body_lines) <= ACTION_CHARS
            ):
                found.append((path, first, last, first - 1))
    return found


def line_end(text: str, at: int) -> int:
    end = text.find("\n", at)
    return len(text) if end < 0 else end


def action_spots(files: list[str], texts: dict[str, str], lang: str, variant: str, limit: int) -> list[Spot]:
    rng = random.Random(13)
    bodies = function_bodies(files, texts, lang)
    rng.shuffle(bodies)
    out: list[Spot] = []
    for path, first, last, header in bodies:
        if len(out) >= limit:
            break
        text = texts[path]
        lines = text.split("\n")
        body = lines[first : last + 1]
        indent = leading_ws(body[0])
        before, after = "\n".join(lines[:first]), "\n".join(lines[last + 1 :])
        if variant == "fh-hole":
            doc = before + "\n" + indent + HOLE.get(lang, "// TODO") + "\n" + after
            out.append(Spot("fillHole", text, doc, len(before) + 1 + len(indent)))
        elif variant == "fh-empty":
            out.append(
                Spot("fillHole", text, before + "\n" + indent + "\n" + after, len(before) + 1 + len(indent))
            )
        elif variant == "fh-braces":
            head_line, closing = lines[header], lines[last + 1] if last + 1 < len(lines) else ""
            if (
                lang == "python"
                or not head_line.rstrip().endswith("{")
                or not closing.strip().startswith("}")
            ):
                continue
            head = "\n".join(lines[:header]) + ("\n" if header else "") + head_line.rstrip()
            rest = "\n" + "\n".join(lines[last + 2 :]) if last + 2 <= len(lines) else ""
            orig = head + "\n" + "\n".join(lines[first:])  # only the inside of the braces differs
            out.append(Spot("fillHole", orig, head + closing.lstrip() + rest, len(head)))
        else:  # cf-blank / cf-eol: the body from a later line of code on is missing
            code = [k for k, x in enumerate(body) if x.strip()]
            if len(code) < 2:
                continue
            m = rng.choice(code[1:])
            if variant == "cf-eol" and not body[m - 1].strip():
                continue
            kept, rest = "\n".join(lines[: first + m]), "\n".join(lines[last + 1 :])
            if variant == "cf-blank":
                typed = leading_ws(body[m])
                doc, cursor = kept + "\n" + typed + "\n" + rest, len(kept) + 1 + len(typed)
            else:
                doc, cursor = kept + "\n" + rest, len(kept)
            out.append(Spot("completeFunction", text, doc, cursor))
    return out


# --- serving a spot's correct answer --------------------------------------------------------------------


def inline_outcome(spot: Spot, lang: str) -> Outcome:
    doc, cursor, orig = spot.doc, spot.cursor, spot.orig
    ctx = build_context(doc, cursor, lang, prefix_tokens=1024, suffix_tokens=256)
    if ctx.mode == "block" and not ctx.start <= cursor <= ctx.end:
        return Outcome("no context")
    ctx = single_line(ctx, doc, cursor) if spot.how == "line" else block_lead_for(ctx, doc, cursor)
    n_after = len(doc) - ctx.end
    ideal = orig[ctx.start : len(orig) - n_after]
    if not ideal.startswith(ctx.lead):
        return Outcome("lead differs", ideal)
    raw = ideal[len(ctx.lead) :]
    if ctx.mode == "line":
        raw = raw.split("\n")[0]  # the model stops at the line end
    _, pinned = fill_request(ctx, SamplerSettings(draft=True), Options(), lambda text: len(text) // 3)
    if pinned:  # the engine fills the hole before the pinned rest of the line and echoes it
        if not raw.endswith(pinned):
            return Outcome("pin differs", raw)
        raw = strip_pinned_tail(raw, pinned)
    post = post_context(ctx)
    state = inline_chain(post).run(raw, post)
    trace = ",".join(state.trace) or "-"
    if state.text is None:
        return Outcome(f"dropped:{trace}", raw)
    fill = state.text
    if ctx.mode == "block" and doc[ctx.start : ctx.end].strip(" \t") != doc[ctx.start : ctx.end].strip():
        fill = fit_body_fill(fill, doc, ctx, cursor)
    edit = one_line_edit(doc, ctx.start, ctx.end, fill, cursor)
    if edit is None or not edit[2]:
        return Outcome(f"no edit:{trace}", raw, state.text)
    return judged(doc[: edit[0]] + edit[2] + doc[edit[1] :], orig, trace, raw, state.text)


def action_outcome(spot: Spot, lang: str) -> Outcome:
    try:
        plan = actions.plan_action(spot.how, spot.doc, lang, spot.cursor, spot.cursor)
    except actions.ActionError as exc:
        return Outcome(f"refused:{str(exc)[:50]}")
    doc, orig = spot.doc, spot.orig
    n_after = len(doc) - plan.end
    if doc[: plan.start] != orig[: plan.start] or doc[plan.end :] != orig[len(orig) - n_after :]:
        return Outcome("edits elsewhere")  # e.g. new lines after the statement the cursor is in
    ideal = orig[plan.start : len(orig) - n_after]
    if not ideal.endswith(plan.trail):
        return Outcome("lead differs", ideal)
    if ideal.startswith(plan.lead):
        raw = ideal[len(plan.lead) : len(ideal) - len(plan.trail)]
    elif plan.lead[:1] == "\n" == ideal[:1] and ideal[1:].lstrip(" \t")[:1] in ")]}":
        raw = ideal[1 : len(ideal) - len(plan.trail)].lstrip(" \t")  # a closer after the typed lead
    else:
        return Outcome("lead differs", ideal)
    post = post_context(plan.ctx)
    chain = inline_chain(post) if plan.action == "completeFunction" else hole_chain(post)
    state = chain.run(raw, post)
    trace = ",".join(state.trace) or "-"
    try:
        edits = actions.finish_action(plan, raw)
    except actions.ActionError as exc:
        return Outcome(f"dropped:{str(exc)[:40]}|{trace}", raw, state.text)
    new = doc
    for s, e, t in sorted(edits, reverse=True):
        new = new[:s] + t + new[e:]
    return judged(new, orig, trace, raw, state.text)


def judged(new: str, orig: str, trace: str, raw: str, shown: str | None) -> Outcome:
    if new == orig:
        return Outcome("ok", raw, shown)
    how = "whitespace only" if re.sub(r"\s+", "", new) == re.sub(r"\s+", "", orig) else "changed"
    return Outcome(f"{how}:{trace if shown != raw else 'after the chain'}", raw, shown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="the checkout spots are cut from")
    parser.add_argument("--glob", action="append", required=True, help="files under --source (repeatable)")
    parser.add_argument("--language", required=True, help="the documents' language (python, cpp, ...)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--limit", type=int, default=200, help="spots per kind")
    parser.add_argument("--examples", type=int, default=0, help="print this many examples of each failure")
    parser.add_argument("--out", type=Path, help="write the counts and examples here (JSON)")
    args = parser.parse_args()
    lang, globs = args.language, tuple(args.glob)
    files = sorted({str(p) for g in globs for p in args.source.glob(g) if p.is_file()})
    texts = {p: Path(p).read_text(encoding="utf-8", errors="replace") for p in files}
    files = [p for p in files if "\r" not in texts[p]]
    makers: dict[str, Callable[[], list[Spot]]] = {
        "line": lambda: line_spots(args.source, globs, args.limit, col0=False),
        "line@col0": lambda: line_spots(args.source, globs, args.limit, col0=True),
        "line-closed": lambda: closed_line_spots(args.source, globs, args.limit),
        **{f"ml-{v}": (lambda v=v: several_line_spots(files, texts, lang, v, args.limit)) for v in ("eol", "blank", "mid")},
        **{v: (lambda v=v: action_spots(files, texts, lang, v, args.limit)) for v in KINDS if v[:3] in ("fh-", "cf-")},
    }  # fmt: skip
    report = {}
    for kind in args.kinds.split(","):
        if kind not in makers:
            parser.error(f"unknown kind {kind!r}")
        counts: collections.Counter[str] = collections.Counter()
        examples: dict[str, list[dict]] = collections.defaultdict(list)
        spots = makers[kind]()
        for spot in spots:
            try:
                outcome = (
                    inline_outcome(spot, lang)
                    if spot.how in ("line", "lines")
                    else action_outcome(spot, lang)
                )
            except Exception as exc:  # noqa: BLE001 - a crash is a finding too
                outcome = Outcome(f"crash:{type(exc).__name__}:{str(exc)[:60]}")
            counts[outcome.verdict] += 1
            if outcome.verdict != "ok" and len(examples[outcome.verdict]) < max(args.examples, 3):
                tail, head = spot.doc[: spot.cursor][-70:], spot.doc[spot.cursor :][:50]
                examples[outcome.verdict].append(
                    dict(tail=tail, head=head, want=outcome.want, got=outcome.got)
                )
        print(f"{kind}: {counts['ok']} of {len(spots)} come through whole", flush=True)
        for verdict, n in counts.most_common():
            if verdict != "ok":
                print(f"  {n:4d} {verdict}")
                for ex in examples[verdict][: args.examples]:
                    print(f"       {ex}")
        report[kind] = dict(spots=len(spots), counts=dict(counts), examples=examples)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
