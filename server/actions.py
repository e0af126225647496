"""Code actions: which fills make sense at a cursor or selection, the engine request each one needs, and the
text edits its result becomes. Pure functions; `dfim.server.app` runs the engine and wraps the edits in a
version-stamped `WorkspaceEdit`.

- fillHole: the `pass` / `...` / TODO / `todo!()` under the cursor, or the empty function body around it;
- completeFunction: several lines at the cursor, kept inside the enclosing function;
- fillSelectionHoles: every hole in the selection in one canvas (the text between them pinned);
- rewriteSelection: the selection regenerated from a warm start (a function's signature pinned);
- regenerateUnsure: only the selection's low-confidence tokens regenerated, the rest pinned.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from dfim.engine.api import Hole, TokenScore
from dfim.engine.layout import code_of_line, unclosed_on_line
from dfim.server.context import (
    FillContext,
    Source,
    build_context,
    empty_body_at,
    enclosing_function,
    find_holes,
    hole_at,
    indent_unit,
    indent_width,
    last_code_before_line,
    leading_ws,
    line_end,
    line_start,
    newline_of,
    next_line_start,
    open_brackets,
    region,
)
from dfim.server.postprocess import (
    clean,
    code_of,
    fit_whitespace,
    limit_scope,
    normalize_newlines,
    trim_block_fill,
)

KIND = "refactor.rewrite.dfim"
TITLES = {
    "fillHole": "dfim: Fill the hole",
    "completeFunction": "dfim: Complete the function body",
    "fillSelectionHoles": "dfim: Fill every hole in the selection",
    "rewriteSelection": "dfim: Rewrite the selection",
    "regenerateUnsure": "dfim: Regenerate the unsure parts of the selection",
}


def available_actions(text: str, lang: str | None, start: int, end: int) -> list[str]:
    """Action names that apply to the cursor (start == end) or selection [start, end)."""
    lo, hi = region(text, start, end, 20000, 20000)
    if lo or hi < len(text):  # editors ask on every cursor move: parse only around the cursor
        return available_actions(text[lo:hi], lang, start - lo, end - lo)
    source = Source(text, lang)
    found: list[str] = []
    selection = end > start and text[start:end].strip() != ""
    if not selection or line_start(text, start) == line_start(text, end):
        if hole_at(source, start) is not None or empty_body_at(source, start) is not None:
            found.append("fillHole")
    if not selection and function_body_around(source, start) is not None:
        found.append("completeFunction")
    if selection:
        if find_holes(source, start, end):
            found.append("fillSelectionHoles")
        found.append("rewriteSelection")
        found.append("regenerateUnsure")
    return found


def function_body_around(source: Source, offset: int) -> tuple[int, int, int, int] | None:
    """The function whose body holds the cursor (its very end included, after the last statement); None
    on the signature, where completing the body makes no sense."""
    text = source.text
    found = enclosing_function(source, offset)
    if found is None and offset > 0:
        found = enclosing_function(source, offset - 1)
    line = text[line_start(text, offset) : line_end(text, offset)]
    if found is None and source.lang in (None, "python") and not line.strip():
        # an indented blank line after a function's last statement still belongs to it (by indentation)
        found = enclosing_function(source, last_code_before_line(text, offset))
        if found is not None:
            header = text[line_start(text, found[0]) : line_end(text, found[0])]
            if indent_width(line) <= indent_width(header):
                return None
    if found is None:
        return None
    fs, fe, bs, _ = found
    if offset < bs and text[offset:bs].strip():  # signature text after the cursor
        return None
    if "\n" not in text[fs:fe]:  # `def f(x): return 1`, `(a) => a + 1`: no body lines to add to
        return None
    return found


def statement_end(text: str, offset: int, lang: str | None, max_lines: int = 50) -> int:
    """The end of the line where the statement at `offset` ends: the cursor's line, or a later one while
    brackets or a triple-quoted string opened before it are still open."""
    start = line_start(text, offset)
    end = line_end(text, offset)
    for _ in range(max_lines):
        chunk = text[start:end]
        if not open_brackets(chunk) and chunk.count('"""') % 2 == 0 and chunk.count("'''") % 2 == 0:
            break
        if end >= len(text):
            break
        end = line_end(text, end + 1)
    return end


@dataclass
class ActionPlan:
    action: str
    start: int  # the document span the result replaces
    end: int
    ctx: FillContext
    middle: list = field(default_factory=list)  # the FillRequest skeleton (strings pinned, Holes denoised)
    max_tokens: int = 128
    warm_start: str | None = None
    holes: list = field(default_factory=list)  # fillSelectionHoles: the hole spans, to split the result
    hole_indents: list = field(default_factory=list)  # and the indentation of each hole's block
    instruction: str | None = None
    original_text: str = ""  # the document text the result replaces
    lead: str = ""  # completeFunction beside a line of code: the line break and indentation before the fill
    trail: str = ""  # ... and the line break after it (new lines above a closing `}`)


SLACK_TOKENS = 8  # room a rewrite gets beyond the selection's own length (it may grow a little)


class ActionError(ValueError):
    """An action that does not apply here (shown to the user, the document untouched)."""


class NothingToChange(ActionError):
    """An action that ran and found nothing to change: an empty edit and a note, not an error."""


def plan_action(
    action: str,
    text: str,
    lang: str | None,
    start: int,
    end: int,
    max_canvas: int = 128,
    prefix_tokens: int = 1024,
    suffix_tokens: int = 256,
    count_tokens: Callable[[str], int] | None = None,
    instruction: str | None = None,
) -> ActionPlan:
    if action not in TITLES:  # before any check of the selection, whose message would mislead
        raise ActionError(f"unknown action {action!r} (known: {', '.join(TITLES)})")
    source = Source(text, lang)
    count = count_tokens or (lambda s: max(1, len(s) // 3))
    windows = dict(prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, count_tokens=count_tokens)

    if action == "fillHole":
        span = hole_at(source, start) or empty_body_at(source, start)
        if span is None:
            raise ActionError("no hole (pass, ..., TODO, empty body) at the cursor")
        if (
            span.kind == "body"
            and text[span.start - 1 : span.start] == "{"
            and text[span.end : span.end + 1] == "}"
            and "\n" not in text[span.start : span.end]
        ):
            # `{}` on one line: the body goes on lines of its own between the braces, as Complete the
            # function body writes it, and the model reads the opened body
            header = text[line_start(text, span.start) : line_end(text, span.start)]
            lead, trail = newline_of(text) + span.indent, newline_of(text) + leading_ws(header)
            return _opened_plan(
                action, text, span.start, span.end, lead, trail, span.indent, lang, max_canvas, windows
            )
        ctx = build_context(
            text, start, lang, max_canvas=max_canvas, mode="block", span=(span.start, span.end), **windows
        )
        ctx.indent = (
            span.indent
            if span.kind == "body"
            else leading_ws(text[line_start(text, span.start) : span.start])
        )
        return ActionPlan(
            action,
            span.start,
            span.end,
            ctx,
            original_text=text[span.start : span.end],
            max_tokens=max_canvas,
        )

    if action == "completeFunction":
        found = function_body_around(source, start)
        if found is None:
            raise ActionError("the cursor is not inside a function's body")
        body = empty_body_at(source, start)
        if body is not None:
            return plan_action(
                "fillHole", text, lang, start, end, max_canvas, prefix_tokens, suffix_tokens, count_tokens
            )
        _, _, bs, _ = found
        first_body_line = text[line_start(text, bs) : line_end(text, bs)]
        body_indent = leading_ws(first_body_line) if text[bs:].startswith(first_body_line.strip()) else None
        ls_ = line_start(text, start)
        line = text[ls_ : line_end(text, start)]
        if not line.strip():  # a blank line: the new lines go right here
            ctx = build_context(
                text, start, lang, max_canvas=max_canvas, mode="multiline", span=(start, start), **windows
            )
            ctx.indent = body_indent if body_indent is not None else ctx.indent
            return ActionPlan(action, start, start, ctx, max_tokens=max_canvas)
        # Code on the cursor's line (the cursor may be mid-word): the new lines never go into it.
        _, _, _, be = found
        if text[be - 1 : be] == "}" and ls_ <= be - 1 <= line_end(text, start):
            # the line that closes a brace body: the new lines go above it, inside the body
            if text[ls_ : be - 1].strip():
                raise ActionError("the body ends on this line: put the cursor on a line of its own inside it")
            indent = leading_ws(line) + indent_unit(text)  # the `}` line's, one level in (Allman too)
            lead, trail, at = indent, newline_of(text), ls_
        else:
            # below the statement the cursor is in (a multi-line call or string included), at its
            # indentation, one level deeper after a line that opens a block (`:` or `{`, comments aside)
            opens_block = start >= bs and code_of(line, lang).endswith((":", "{"))
            at = line_end(text, start) if opens_block else statement_end(text, start, lang)
            indent = (
                leading_ws(line) if start >= bs else (body_indent or leading_ws(line) + indent_unit(text))
            )
            if opens_block:
                indent += indent_unit(text)
            lead, trail = newline_of(text) + indent, ""
        return _opened_plan(action, text, at, at, lead, trail, indent, lang, max_canvas, windows)

    if end <= start or (action == "rewriteSelection" and not text[start:end].strip()):
        raise ActionError("select the code first")  # (nothing unsure in blank lines: regenerate says so)
    selected = text[start:end]
    ctx = build_context(text, start, lang, max_canvas=max_canvas, mode="block", span=(start, end), **windows)
    ctx.indent = ""

    if action == "fillSelectionHoles":
        holes = find_holes(source, start, end)
        if not holes:
            raise ActionError("no holes (pass, ..., TODO) in the selection")
        pinned: list[str] = []  # the text between holes, in order (None marks a hole)
        cursor = start
        for hole in holes:
            if hole.start > cursor:
                pinned.append(text[cursor : hole.start])
            pinned.append(None)
            cursor = hole.end
        if end > cursor:
            pinned.append(text[cursor:end])
        # each piece is tokenized on its own (a token more at a seam), and the canvas ends with EOS
        pinned_tokens = sum(count(p) + 1 for p in pinned if p is not None) + 1
        width = min(32, (max_canvas - pinned_tokens) // len(holes))
        if width < 4:
            raise ActionError(
                f"the selection is too long for one canvas (about {pinned_tokens + 4 * len(holes)} tokens "
                f"with room for its {len(holes)} holes; the canvas holds {max_canvas}): select less"
            )
        middle: list = [Hole(width) if p is None else p for p in pinned]
        return ActionPlan(
            action,
            start,
            end,
            ctx,
            original_text=text[start:end],
            middle=middle,
            max_tokens=max_canvas,
            holes=holes,
            hole_indents=[_block_indent(text, hole.start) for hole in holes],
        )

    if action in ("rewriteSelection", "regenerateUnsure"):
        header = ""
        warm = selected
        found = selected_function(source, start, end)
        if action == "rewriteSelection" and found is not None:
            fs, _, bs, _ = found
            if text[start:bs].strip():  # everything up to the body: the signature stays as written
                cut = header_end(text, bs)
                header, warm = text[start:cut], text[cut:end]
        pinned, body = (count(header) if header else 0), count(warm)
        room = max_canvas - pinned
        if body + SLACK_TOKENS > room:
            # A rewrite is cut at the canvas's end; replacing the whole selection with that would lose code.
            raise ActionError(
                f"the selection is too long for one canvas (about {pinned + body} tokens; "
                f"the canvas holds {max_canvas}): select less"
            )
        budget = min(room, int(body * 1.5) + SLACK_TOKENS)
        middle: list = [header, Hole(budget)] if header else []
        return ActionPlan(
            action,
            start,
            end,
            ctx,
            original_text=text[start:end],
            middle=middle,
            max_tokens=budget,
            warm_start=warm,
            instruction=instruction,
        )

    raise ActionError(f"unknown action {action!r}")


def _opened_plan(
    action: str,
    text: str,
    start: int,
    end: int,
    lead: str,
    trail: str,
    indent: str,
    lang: str | None,
    max_canvas: int,
    windows: dict,
) -> ActionPlan:
    """A plan that writes new lines in place of [start, end): `lead` (a line break and the first line's
    indentation) and `trail` go around the fill, and the model reads the document already opened that way,
    its cursor after the lead."""
    opened = text[:start] + lead + trail + text[end:]
    cursor = start + len(lead)
    ctx = build_context(
        opened, cursor, lang, max_canvas=max_canvas, mode="multiline", span=(cursor, cursor), **windows
    )
    ctx.indent = indent
    return ActionPlan(action, start, end, ctx, max_tokens=max_canvas, lead=lead, trail=trail)


def selected_function(source: Source, start: int, end: int) -> tuple[int, int, int, int] | None:
    """The function a selection holds whole (`enclosing_function`'s spans), looked for from each word of the
    selection's first line of code: past decorators (`@property`: a Python function's node starts at
    `def`), and past what wraps a function in the line (`export function f`, `const twice = (x) =>`)."""
    text = source.text
    probe = start + len(text[start:end]) - len(text[start:end].lstrip())
    while text.startswith("@", probe) and next_line_start(text, probe) < end:
        nxt = next_line_start(text, probe)
        probe = nxt + len(text[nxt:end]) - len(text[nxt:end].lstrip())
    for word in re.finditer(r"\S+", text[probe : min(end, line_end(text, probe))]):
        found = enclosing_function(source, probe + word.start())
        if found is not None and found[0] >= start and found[1] <= end:
            return found
    return None


def close_what_it_opened(fill: str, lang: str | None, first_indent: str = "") -> str:
    """A several-line fill that ends (where a canvas or a cut tail ended it) inside what it opened, closed:
    the brackets its last line opens close on that line (`return math.isnan(r` -> `...(r)`), a brace an
    earlier line opened closes on a line of its own at that line's indentation, and a triple-quoted string
    it starts but never ends goes, from its line on. Lines are read as code (`dfim.engine.layout.scan_line`):
    brackets in comments and strings count for nothing. The first line stands at `first_indent` (the
    hole's; the model writes after it)."""
    for quote in ('"""', "'''"):
        if lang in (None, "python") and fill.count(quote) % 2 == 1:
            fill = fill[: line_start(fill, fill.rfind(quote))].rstrip()
    if not fill.strip():
        return ""
    lines = fill.rstrip().split("\n")
    lines[-1] += unclosed_on_line(lines[-1].rstrip("\r"), lang)
    braces: list[str] = []  # the indentation of each line that opened a brace still open
    for i, line in enumerate(lines):
        for c in code_of_line(line.rstrip("\r"), lang):
            if c == "{":
                braces.append(leading_ws(line) if i else first_indent)
            elif c == "}" and braces:
                braces.pop()
    newline = "\r\n" if "\r\n" in fill else "\n"
    return "\n".join(lines) + "".join(newline + indent + "}" for indent in reversed(braces))


def header_end(text: str, body_start: int) -> int:
    """Where a function's pinned signature ends, given where tree-sitter starts its body: after a brace
    body's `{` (the body node starts at it), and at the end of the header's line, so the body's first line
    keeps its own indentation (a Python body node starts after it: pinned, the model wrote the line's
    first token with one more space)."""
    at = body_start + 1 if text[body_start : body_start + 1] == "{" else body_start
    line_break = line_start(text, at)
    if line_break > 0 and not text[line_break:at].strip():
        return line_break  # the indentation before the body's first line goes to the body
    end = line_end(text, at)
    if not text[at:end].strip():
        return next_line_start(text, at)  # `{` ends its line: the line break is the header's
    return at


def unsure_skeleton(
    pieces: list[str], scores: list[TokenScore], threshold: float, limit: int | None = None
) -> list | None:
    """A skeleton over the selection's tokens (`pieces`): confident ones pinned, each run of unsure ones
    (the model would write another token there, or it is not sure of it) opened as a hole one token wider,
    room to grow. `scores[i]` is the model's view of position i; None when nothing is unsure."""
    middle: list = []
    run = 0
    pinned = ""
    any_unsure = False
    for i, piece in enumerate(pieces):
        score = scores[i] if i < len(scores) else None
        unsure = (
            score is not None
            and piece.strip() != ""
            and (score.confidence < threshold or score.text != piece)
        )
        if unsure:
            if pinned:
                middle.append(pinned)
                pinned = ""
            run += 1
            any_unsure = True
        else:
            if run:
                middle.append(Hole(run + 1))
                run = 0
            pinned += piece
    if run:
        middle.append(Hole(run + 1))
    if pinned:
        middle.append(pinned)
    if not any_unsure:
        return None
    holes = sum(1 for m in middle if isinstance(m, Hole))
    if limit is not None and len(pieces) + holes + 1 > limit:  # no room to grow: each hole keeps its width
        middle = [Hole(m.width - 1) if isinstance(m, Hole) else m for m in middle]
    return middle


def finish_action(
    plan: ActionPlan, result_text: str, token_scores: Sequence[TokenScore] = ()
) -> list[tuple[int, int, str]]:
    """The document edits (start, end, new text) for an engine result; raises ActionError if unusable.
    `token_scores` (the result's, with each token's pinned flag) split a holes fill exactly."""
    ctx = plan.ctx
    if plan.action == "fillSelectionHoles":
        return _split_holes(plan, result_text, token_scores)
    if plan.action in ("rewriteSelection", "regenerateUnsure"):
        text = normalize_newlines(result_text, ctx.newline)
        if not text.strip():
            raise ActionError("the model returned nothing for the selection")
        return [(plan.start, plan.end, _keep_outer_ws(text, plan.original_text))]
    # fillHole / completeFunction
    if plan.action == "completeFunction":
        text = clean(result_text, ctx)
    else:
        text = limit_scope(result_text, ctx, max_lines=200)
        text = trim_block_fill(text, ctx, max_lines=200)
        text = normalize_newlines(text, ctx.newline)
        if not text.strip():
            text = None
    if text is None:
        raise ActionError("the model produced nothing usable here")
    text = close_what_it_opened(text, ctx.lang, ctx.indent)
    if not text.strip():
        raise ActionError("the model produced nothing usable here")
    if plan.lead or plan.trail:  # the lead ends with the first line's indentation: the fill starts after it
        return [(plan.start, plan.end, plan.lead + text.lstrip(" \t") + plan.trail)]
    if plan.action == "fillHole":
        if ctx.prefix.endswith((" ", "\t")) and not plan.original_text[:1].isspace():
            text = text.lstrip(" \t")  # the hole sits after its line's indentation: so does the fill
        text = fit_whitespace(text, plan.original_text, ctx.newline, ctx.indent)
    return [(plan.start, plan.end, text)]


def _keep_outer_ws(new: str, old: str) -> str:
    """A rewrite keeps the selection's leading and trailing whitespace as it was."""
    lead = old[: len(old) - len(old.lstrip())]
    trail = old[len(old.rstrip()) :]
    return lead + new.strip() + trail if new.strip() else old


def _fills_by_pins(middle: Sequence[str | Hole], token_scores: Sequence[TokenScore]) -> list[str] | None:
    """Each hole's fill, read off the engine's tokens: pinned tokens spell the pieces between the holes, free
    ones the fills. None when the runs do not line up with the skeleton (then the text is searched)."""
    runs: list[list] = []  # [pinned, text]
    for score in token_scores:
        if runs and runs[-1][0] == score.pinned:
            runs[-1][1] += score.text
        else:
            runs.append([score.pinned, score.text])
    fills: list[str] = []
    for piece in middle:
        run = runs.pop(0) if runs else None
        if isinstance(piece, str):
            if run is None or not run[0] or run[1] != piece:
                return None
        elif run is None or run[0]:  # a hole with no free token (the last one may end at once)
            if run is not None:
                runs.insert(0, run)
            fills.append("")
        else:
            fills.append(run[1])
    return None if runs else fills


def _split_holes(
    plan: ActionPlan, result_text: str, token_scores: Sequence[TokenScore] = ()
) -> list[tuple[int, int, str]]:
    """One edit per hole: the result is the selection with each hole filled. The engine's tokens say which
    text was pinned; without them (or if they do not line up), find the pinned pieces in order and take
    what lies between them."""
    fills = _fills_by_pins(plan.middle, token_scores) if token_scores else None
    if fills is not None:
        edits = [(hole.start, hole.end, fill) for hole, fill in zip(plan.holes, fills, strict=True)]
        edits[-1] = (*edits[-1][:2], edits[-1][2].rstrip())
        return _finish_hole_edits(plan, edits)
    pieces = [m for m in plan.middle]
    edits: list[tuple[int, int, str]] = []
    pos = 0
    hole_index = 0
    pending_fill_start: int | None = None
    for i, piece in enumerate(pieces):
        if isinstance(piece, str):
            # the last piece closes the canvas: match it at the end (a fill may contain its text, often
            # a bare line break)
            last = i == len(pieces) - 1 and i > 0
            found = result_text.rfind(piece) if last else result_text.find(piece, pos)
            if found < pos:
                found = -1
            if found < 0:  # the text between the holes did not come back as written: apply nothing
                raise ActionError("the model's answer does not keep the code between the holes; try again")
            if pending_fill_start is not None:
                hole = plan.holes[hole_index - 1]
                edits.append((hole.start, hole.end, result_text[pending_fill_start:found]))
                pending_fill_start = None
            pos = found + len(piece)
        else:
            hole_index += 1
            pending_fill_start = pos
    if pending_fill_start is not None:
        hole = plan.holes[hole_index - 1]
        edits.append((hole.start, hole.end, result_text[pending_fill_start:].rstrip()))
    return _finish_hole_edits(plan, edits)


def _finish_hole_edits(plan: ActionPlan, edits: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    for _s, _e, fill in edits:
        if not fill.strip():
            raise ActionError("the model left a hole empty")
    return [
        (s, e, _fit_hole_fill(fill, plan.ctx, indent))
        for (s, e, fill), indent in zip(edits, plan.hole_indents, strict=True)
    ]


def _block_indent(text: str, offset: int) -> str | None:
    """The indentation of the block a hole at `offset` belongs to (its line's); None when code precedes it
    on the line (`def f(x): pass`), where a fill can only be one line."""
    before = text[line_start(text, offset) : offset]
    return before if not before.strip() else None


def _fit_hole_fill(fill: str, ctx: FillContext, block_indent: str | None) -> str:
    """A hole's fill as it goes into the document: no space before it (the hole sits after its line's
    indentation), the document's line ends, and only the lines that stay in the hole's block."""
    body = fill.strip("\r\n").lstrip(" \t").rstrip()
    scope = (
        replace(ctx, mode="line") if block_indent is None else replace(ctx, mode="block", indent=block_indent)
    )
    return limit_scope(body, scope, max_lines=200).rstrip()


# ---- the LSP feature -----------------------------------------------------------------------------------

RUN_COMMAND = "dfim.runAction"  # arguments: [data] as carried by a code action
REQUEST_FAILED = -32803  # LSP 3.17's RequestFailed (pygls has no class for it)
ACTION_COMMANDS = {f"dfim.{name}": name for name in TITLES}  # arguments: [uri, range, instruction?]


def _resolve_supported(ls) -> bool:
    caps = ls.client_capabilities
    try:
        support = caps.text_document.code_action.resolve_support
        return support is not None and "edit" in support.properties
    except AttributeError:
        return False


def register(ls) -> None:
    from lsprotocol import types
    from pygls.exceptions import JsonRpcInvalidParams

    from dfim.server.context import language_for
    from dfim.server.documents import PositionError

    options = types.CodeActionOptions(code_action_kinds=[KIND], resolve_provider=True)

    @ls.feature(types.TEXT_DOCUMENT_CODE_ACTION, options)
    def code_action(ls, params: types.CodeActionParams):
        only = params.context.only
        if only and not any(KIND == k or KIND.startswith(f"{k}.") for k in only):
            return None
        doc = ls.docs.get(params.text_document.uri)
        if doc is None:
            return None
        try:
            start, end = doc.range_offsets(params.range, ls.docs.encoding)
        except PositionError as exc:
            raise JsonRpcInvalidParams(f"range: {exc}") from None
        names = available_actions(doc.text, language_for(doc.language_id, doc.uri), start, end)
        resolve = _resolve_supported(ls)
        out = []
        for name in names:
            data = {
                "uri": doc.uri,
                "version": doc.version,
                "action": name,
                "range": ls.protocol._converter.unstructure(params.range),
            }
            action = types.CodeAction(title=TITLES[name], kind=KIND, data=data)
            if not resolve:  # clients without resolve run the command; it sends workspace/applyEdit
                action.command = types.Command(title=TITLES[name], command=RUN_COMMAND, arguments=[data])
            out.append(action)
        return out

    @ls.feature(types.CODE_ACTION_RESOLVE)
    async def resolve_code_action(ls, action: types.CodeAction):
        name = action.data.get("action") if isinstance(action.data, dict) else None
        if not isinstance(name, str) or name not in TITLES:  # not ours (a list is not even hashable)
            return action
        action.edit = await run_action(ls, action.data)
        return action

    @ls.command(RUN_COMMAND)
    async def run_command(ls, *args):
        if not args or not isinstance(args[0], dict):
            raise JsonRpcInvalidParams(f"{RUN_COMMAND} takes one argument: the action's data")
        edit = await run_action(ls, args[0])
        return await _apply(ls, edit, TITLES.get(args[0].get("action"), "dfim"))

    for command, name in ACTION_COMMANDS.items():
        ls.command(command)(_direct_command(name))


def _direct_command(name: str):
    """`dfim.<action>` with arguments [uri, range, instruction?]: compute the edit and apply it."""
    from pygls.exceptions import JsonRpcInvalidParams

    async def direct(ls, *args):
        if len(args) < 2:
            raise JsonRpcInvalidParams(f"dfim.{name} takes [uri, range, instruction?]")
        data = {"uri": args[0], "version": None, "action": name, "range": args[1]}
        if len(args) > 2 and args[2] is not None:
            data["instruction"] = str(args[2])
        edit = await run_action(ls, data)
        return await _apply(ls, edit, TITLES[name])

    return direct


async def _apply(ls, edit, label: str) -> dict:
    """Send the edit to the client with `workspace/applyEdit` where it says it takes one; the command's result
    carries the edit either way (a client without applyEdit applies it from there)."""
    from lsprotocol import types

    unstructured = ls.protocol._converter.unstructure(edit)
    caps = ls.client_capabilities
    empty = not any(change.edits for change in edit.document_changes or ())
    if empty or not (caps and caps.workspace and caps.workspace.apply_edit):
        return {"applied": False, "edit": unstructured}
    result = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label=label))
    return {"applied": bool(result and result.applied), "edit": unstructured}


async def run_action(ls, data: dict):
    """Compute one action's WorkspaceEdit, stamped with the document version it was computed from."""
    import asyncio
    import dataclasses
    import threading

    from lsprotocol import types
    from pygls.exceptions import (
        JsonRpcContentModified,
        JsonRpcException,
        JsonRpcInternalError,
        JsonRpcInvalidParams,
    )

    from dfim.engine.api import EngineError, FillCancelled, FillRequest
    from dfim.server.context import language_for
    from dfim.server.documents import Document, PositionError
    from dfim.server.options import quoted

    # `data` comes back from the client (a resolve's data, a command's arguments): check its types before use
    uri, action, instruction = data.get("uri"), data.get("action"), data.get("instruction")
    if not isinstance(uri, str):
        raise JsonRpcInvalidParams(f"the action's uri must be a string, got {quoted(uri)}")
    if not isinstance(action, str) or action not in TITLES:
        raise JsonRpcInvalidParams(f"dfim: unknown action {quoted(action)} (known: {', '.join(TITLES)})")
    if instruction is not None and not isinstance(instruction, str):
        raise JsonRpcInvalidParams(f"the action's instruction must be a string, got {quoted(instruction)}")
    doc = ls.docs.get(uri)
    if doc is None:
        raise JsonRpcInvalidParams(f"document {uri} is not open")
    if data.get("version") is not None and data["version"] != doc.version:
        raise JsonRpcContentModified("the document changed since this action was offered")
    text, version, encoding = doc.text, doc.version, ls.docs.encoding
    try:
        rng = ls.protocol._converter.structure(data.get("range"), types.Range)
        start, end = doc.range_offsets(rng, encoding)
    except PositionError as exc:
        raise JsonRpcInvalidParams(f"range: {exc}") from None
    except Exception as exc:
        raise JsonRpcInvalidParams(f"bad range {data.get('range')!r}: {exc}") from None
    options = ls.options
    if not ls.host.ready:
        raise JsonRpcException(  # LSP's RequestFailed: valid params, the server cannot serve it now
            f"dfim: the model is not ready ({ls.host.error or 'still loading'})", code=REQUEST_FAILED
        )
    lang = language_for(doc.language_id, uri)
    prefix_tokens, suffix_tokens = ls.host.context_budget(
        options.context.prefix_tokens, options.context.suffix_tokens
    )
    # the canvas an action may use: the setting, but never more than the model was built for
    max_canvas = min(options.sampling.max_canvas, getattr(ls.host.engine, "canvas_limit", 256))
    try:
        plan = plan_action(
            action,
            text,
            lang,
            start,
            end,
            max_canvas=max_canvas,
            prefix_tokens=prefix_tokens,
            suffix_tokens=suffix_tokens,
            count_tokens=ls.host.count_tokens,
            instruction=instruction,
        )
    except ActionError as exc:
        raise JsonRpcInvalidParams(f"dfim: {exc}") from None

    engine = ls.host.engine
    settings = dataclasses.replace(
        engine.settings,
        max_steps=options.sampling.action_max_steps,
        entropy_bound=options.sampling.entropy_bound,
    )
    loop = asyncio.get_running_loop()
    flag = threading.Event()
    running = ls.actions_running.setdefault(uri, set())
    running.add(flag)  # an edit or close of the document raises it: the edit would be stale (`changed`)
    token = await _begin_progress(ls, TITLES[plan.action], flag)

    def changed() -> bool:
        now = ls.docs.get(uri)
        return now is None or now.version != version

    def on_step(info) -> None:
        if token is None or info.step == 0:  # step 0 is the draft: no denoising step done yet
            return
        message = f"step {info.step}/{info.max_steps}, {info.accepted} tokens accepted"
        percent = int(100 * info.step / max(1, info.max_steps))
        loop.call_soon_threadsafe(
            ls.work_done_progress.report,
            token,
            types.WorkDoneProgressReport(message=message, percentage=percent, cancellable=True),
        )

    ls.status.begin_fill()
    result = None
    try:
        if plan.action == "regenerateUnsure":
            # one step from the selection itself (no renoising): the model's confidence at each position
            pieces = ls.host.token_pieces(plan.original_text)
            score = FillRequest(
                prefix=plan.ctx.prefix,
                suffix=plan.ctx.suffix,
                max_tokens=len(pieces) + 1,
                warm_start=plan.original_text,
                warm_start_noise=0.0,
                settings=dataclasses.replace(settings, max_steps=1),
                seed=options.sampling.seed,
            )
            scored = await ls.host.fill(score, flag)
            skeleton = unsure_skeleton(
                pieces, scored.token_scores, options.actions.unsure_threshold, limit=max_canvas
            )
            if skeleton is None:
                raise NothingToChange("every token of the selection is confident; nothing to regenerate")
            plan.middle = skeleton
            plan.warm_start = None
        request = FillRequest(
            prefix=plan.ctx.prefix,
            suffix=plan.ctx.suffix,
            middle=plan.middle,
            max_tokens=plan.max_tokens,
            warm_start=plan.warm_start,
            instruction=plan.instruction
            or "",  # read by instruction-tuned checkpoints only (dfim.engine.inference.chat)
            settings=settings,
            seed=options.sampling.seed,
            candidates=options.actions.candidates,
            on_step=on_step,
        )
        result = await ls.host.fill(request, flag)
        if changed():
            raise FillCancelled("the document changed")
        edits = finish_action(plan, result.text, result.token_scores)
    except NothingToChange as exc:
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Info, message=f"dfim: {exc}"))
        edits = []
    except ActionError as exc:  # the model ran and wrote nothing usable: the request was fine
        raise JsonRpcException(f"dfim: {exc}", code=REQUEST_FAILED) from None
    except FillCancelled:
        if changed():
            raise JsonRpcContentModified("the document changed while the action ran") from None
        from pygls.exceptions import JsonRpcRequestCancelled

        raise JsonRpcRequestCancelled("dfim: cancelled") from None
    except EngineError as exc:
        raise JsonRpcInternalError(f"dfim: the engine failed: {exc}") from None
    except Exception as exc:  # a bug in the engine fails this request only
        raise JsonRpcInternalError(f"dfim: the engine failed: {type(exc).__name__}: {exc}") from None
    finally:
        running.discard(flag)
        if not running:
            ls.actions_running.pop(uri, None)
        if result is not None:
            ls.status.end_fill(result.latency_ms, result.steps, result.stop_reason)
        else:
            ls.status.end_fill()
        if token is not None:
            ls.work_done_progress.end(
                token, types.WorkDoneProgressEnd(message="done" if result else "stopped")
            )
            ls.work_done_progress.tokens.pop(token, None)
        ls.note_fallback()

    snapshot = Document(uri=uri, text=text, version=version)
    text_edits = [
        types.TextEdit(range=snapshot.range_at(s, e, encoding), new_text=new) for s, e, new in edits
    ]
    return types.WorkspaceEdit(
        document_changes=[
            types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version),
                edits=text_edits,
            )
        ]
    )


async def _begin_progress(ls, title: str, flag):
    """A server-created `$/progress` token when the client supports it; its cancel raises `flag`."""
    import uuid

    from lsprotocol import types

    caps = ls.client_capabilities
    if not (caps and caps.window and caps.window.work_done_progress):
        return None
    token = f"dfim-{uuid.uuid4().hex[:12]}"
    try:
        await ls.work_done_progress.create_async(token)
    except Exception:
        return None
    ls.work_done_progress.begin(
        token, types.WorkDoneProgressBegin(title=title, cancellable=True, percentage=0)
    )
    future = ls.work_done_progress.tokens.get(token)
    if future is not None:
        future.add_done_callback(lambda _f: flag.set())
    return token
