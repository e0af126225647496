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

import ast
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from dfim.engine.api import Hole, TokenScore
from dfim.engine.layout import (
    BRACE_LANGUAGES,
    CLOSER_OF,
    CLOSERS,
    code_of_line,
    opener_indent,
    opens_braceless,
    statement_indent,
    unclosed_on_line,
)
from dfim.server.context import FillContext, build_context, indent_unit, leading_ws, region
from dfim.server.holes import (
    empty_body_at,
    enclosing_function,
    find_holes,
    function_names,
    hole_at,
    last_code_before_line,
)
from dfim.server.languages import Source, bracket_balance, error_count
from dfim.server.lines import indent_width, line_end, line_start, newline_of, next_line_start, open_brackets
from dfim.server.post_context import parse_window, post_context
from dfim.server.postprocess import clean, hole_chain
from dfim.server.rules import code_of, fit_whitespace, limit_scope, normalize_newlines, writes_code
from dfim.server.windows import guess_tokens

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


# A selection this many characters per canvas token is too long whatever the tokenizer (none packs more
# into a token), so it is refused without tokenizing it: code actions are asked on every selection change.
MAX_CHARS_PER_TOKEN = 32


def too_long(
    action: str,
    text: str,
    lang: str | None,
    start: int,
    end: int,
    max_canvas: int,
    count: Callable[[str], int],
) -> str | None:
    """Why the selection [start, end) cannot be one canvas of `action`, by the rule its planner applies
    (`plan_rewrite`, `plan_fill_selection_holes`); None when it fits, or the action takes no selection. Lets
    the server show such an action as disabled, with the reason, instead of offering what it then refuses."""
    if action not in ("rewriteSelection", "regenerateUnsure", "fillSelectionHoles") or end <= start:
        return None
    if end - start > MAX_CHARS_PER_TOKEN * max_canvas:
        return f"the selection is too long for one canvas ({max_canvas} tokens): select less"
    if action == "fillSelectionHoles":
        lo, hi = region(text, start, end, 20000, 20000)  # parsed around the selection, as `available_actions`
        holes = find_holes(Source(text[lo:hi], lang), start - lo, end - lo)
        pinned = _pinned_around(text[lo:hi], start - lo, end - lo, holes)
        needed = _pinned_tokens(pinned, count) + MIN_HOLE_TOKENS * len(holes)
    else:
        needed = count(text[start:end]) + SLACK_TOKENS
    if needed > max_canvas:
        return (
            f"the selection is too long for one canvas (about {needed} tokens of {max_canvas}): select less"
        )
    return None


def function_body_around(source: Source, offset: int) -> tuple[int, int, int, int] | None:
    """The function whose body holds the cursor (its very end included, after the last statement); None
    on the signature, where completing the body makes no sense. Where the blocks or brackets around the
    cursor are not closed yet (typed without an editor that closes them: a brace body's inner blocks, a
    Python call's arguments), the function found with them closed at the cursor: its body then ends just
    after the cursor."""
    found = _function_around(source, offset)
    if found is not None or source.tree is None or not source.tree.root_node.has_error:
        return found
    text = source.text
    stack = open_brackets(text[:offset], limit=20000)
    if not stack or ("{" not in stack and source.lang in BRACE_LANGUAGES):
        return None
    closers = "".join(CLOSER_OF[c] for c in reversed(stack))
    found = _function_around(Source(text[:offset] + "\n" + closers + text[offset:], source.lang), offset)
    if found is None:
        return None
    end = min(offset + 1, len(text))
    return found[0], end, found[2], end


def _function_around(source: Source, offset: int) -> tuple[int, int, int, int] | None:
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
    around: tuple[str, str] = ("", "")  # the document before `start` and after `end` (windows): where a
    # result must not break code that parsed (`_breaks_code`)


NO_CODE = "the model wrote only comments or a docstring here, no code; nothing was changed"
BREAKS_CODE = "the model's rewrite does not parse where the selection did; nothing was changed"
BREAKS_CODE_FILL = "the model's code does not parse here, where the code around it did; nothing was changed"
# The document kept around an action's span, to parse its result in the top-level statement it edits
# (`_window`): a class longer than this before the span is not judged
AROUND_BEFORE, AROUND_AFTER = 64_000, 16_000
SLACK_TOKENS = 8  # room a rewrite gets beyond the selection's own length (it may grow a little)
MIN_HOLE_TOKENS = 4  # the least room a hole of a selection gets in its canvas


class ActionError(ValueError):
    """An action that does not apply here (shown to the user, the document untouched)."""


class NothingToChange(ActionError):
    """An action that ran and found nothing to change: an empty edit and a note, not an error."""


@dataclass
class ActionInput:
    """What every planner reads: the document, the cursor or selection, and the canvas and window budgets."""

    action: str
    source: Source
    lang: str | None  # the document's language (Source keeps only those it has a grammar for)
    start: int
    end: int
    max_canvas: int
    windows: dict  # build_context's prefix_tokens, suffix_tokens and count_tokens
    count: Callable[[str], int]  # tokens in a piece of text (the model's tokenizer, or a guess)
    instruction: str | None = None

    @property
    def text(self) -> str:
        return self.source.text

    def context(self, at: int, mode: str, span: tuple[int, int], text: str | None = None) -> FillContext:
        return build_context(
            self.text if text is None else text,
            at,
            self.lang,
            max_canvas=self.max_canvas,
            mode=mode,
            span=span,
            **self.windows,
        )


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
    """The plan of one action at a cursor (start == end) or selection; ActionError where it does not apply."""
    if action not in PLANNERS:  # before any check of the selection, whose message would mislead
        raise ActionError(f"unknown action {action!r} (known: {', '.join(TITLES)})")
    inp = ActionInput(
        action=action,
        source=Source(text, lang),
        lang=lang,
        start=start,
        end=end,
        max_canvas=max_canvas,
        windows=dict(prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens, count_tokens=count_tokens),
        count=count_tokens or guess_tokens,
        instruction=instruction,
    )
    plan = PLANNERS[action](inp)
    plan.original_text = text[plan.start : plan.end]
    plan.around = (
        text[max(0, plan.start - AROUND_BEFORE) : plan.start],
        text[plan.end : plan.end + AROUND_AFTER],
    )
    return plan


def plan_fill_hole(inp: ActionInput) -> ActionPlan:
    """The `pass` / `...` / TODO / `todo!()` under the cursor, or the empty body around it, is replaced."""
    text = inp.text
    span = hole_at(inp.source, inp.start) or empty_body_at(inp.source, inp.start)
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
        lead, trail = newline_of(text) + span.indent, newline_of(text) + span.header_indent
        return _opened_plan(inp, span.start, span.end, lead, trail, span.indent)
    ctx = inp.context(inp.start, "block", (span.start, span.end))
    ctx.indent = (
        span.indent if span.kind == "body" else leading_ws(text[line_start(text, span.start) : span.start])
    )
    return ActionPlan(
        inp.action,
        span.start,
        span.end,
        ctx,
        original_text=text[span.start : span.end],
        max_tokens=inp.max_canvas,
    )


def plan_complete_function(inp: ActionInput) -> ActionPlan:
    """Several new lines at the cursor, kept inside the enclosing function's body."""
    text, start = inp.text, inp.start
    found = function_body_around(inp.source, start)
    if found is None:
        raise ActionError("the cursor is not inside a function's body")
    if empty_body_at(inp.source, start) is not None:
        return plan_fill_hole(replace(inp, action="fillHole", instruction=None))
    _, _, bs, be = found
    body_indent = _body_indent(text, bs, be)
    ls_ = line_start(text, start)
    line = text[ls_ : line_end(text, start)]
    if not line.strip():  # a blank line: the new lines go right here
        ctx = inp.context(start, "multiline", (start, start))
        ctx.indent = body_indent if body_indent is not None else ctx.indent
        return ActionPlan(inp.action, start, start, ctx, max_tokens=inp.max_canvas)
    # Code on the cursor's line (the cursor may be mid-word): the new lines never go into it.
    if text[bs : bs + 1] == "{" and text[be - 1 : be] == "}" and ls_ <= be - 1 <= line_end(text, start):
        # the line that closes a brace body: the new lines go above it, inside the body
        if text[ls_ : be - 1].strip():
            raise ActionError("the body ends on this line: put the cursor on a line of its own inside it")
        indent = body_indent or leading_ws(line) + indent_unit(text, inp.lang)  # one level in from `}`
        lead, trail, at = indent, newline_of(text), ls_
    else:
        # below the statement the cursor is in (a multi-line call or string included), at its
        # indentation, one level deeper after a line that opens a block (`:` or `{`, comments aside)
        opens_block = start >= bs and (
            code_of(line, inp.lang).endswith((":", "{")) or opens_braceless(line, inp.lang)
        )
        at = line_end(text, start) if opens_block else statement_end(text, start, inp.lang)
        indent = (
            statement_indent(text[:at], inp.lang)
            if start >= bs
            else (body_indent or leading_ws(line) + indent_unit(text, inp.lang))
        )
        if opens_block:
            indent += indent_unit(text, inp.lang)
        lead, trail = newline_of(text) + indent, ""
    # the new lines may go on past the cursor's block, to the end of the function's body
    return _opened_plan(inp, at, at, lead, trail, body_indent or indent)


def _body_indent(text: str, bs: int, be: int) -> str | None:
    """The indentation of a function body's lines: its first line's, where the body starts a line (Python);
    in a brace body, that of its first line of code after the `{` line. None where no such line says."""
    first = text[line_start(text, bs) : line_end(text, bs)]
    if text[bs : bs + 1] != "{":
        return leading_ws(first) if text[bs:].startswith(first.strip()) else None
    at = next_line_start(text, bs)
    while at < be:
        line = text[at : line_end(text, at)]
        if line.strip() and not line.strip().startswith("}"):
            return leading_ws(line)
        at = next_line_start(text, at)
    return None


def _selection_context(inp: ActionInput) -> FillContext:
    """The context of an action on a selection; ActionError when nothing (or, to rewrite, only blank space)
    is selected. Blank lines hold nothing unsure either, but Regenerate says so itself, with an empty edit."""
    if inp.end <= inp.start or (
        inp.action == "rewriteSelection" and not inp.text[inp.start : inp.end].strip()
    ):
        raise ActionError("select the code first")
    ctx = inp.context(inp.start, "block", (inp.start, inp.end))
    ctx.indent = ""
    return ctx


def _pinned_around(text: str, start: int, end: int, holes) -> list[str | None]:
    """The selection [start, end) as the text between its holes, in order, None marking each hole."""
    pinned: list[str | None] = []
    cursor = start
    for hole in holes:
        if hole.start > cursor:
            pinned.append(text[cursor : hole.start])
        pinned.append(None)
        cursor = hole.end
    if end > cursor:
        pinned.append(text[cursor:end])
    return pinned


def _pinned_tokens(pinned: list[str | None], count: Callable[[str], int]) -> int:
    """The canvas tokens the pinned pieces take: each tokenized on its own (a token more at a seam), and the
    canvas ends with EOS."""
    return sum(count(p) + 1 for p in pinned if p is not None) + 1


def plan_fill_selection_holes(inp: ActionInput) -> ActionPlan:
    """Every hole in the selection in one canvas, the text between them pinned."""
    ctx = _selection_context(inp)
    text, start, end = inp.text, inp.start, inp.end
    holes = find_holes(inp.source, start, end)
    if not holes:
        raise ActionError("no holes (pass, ..., TODO) in the selection")
    pinned = _pinned_around(text, start, end, holes)
    pinned_tokens = _pinned_tokens(pinned, inp.count)
    width = min(32, (inp.max_canvas - pinned_tokens) // len(holes))
    if width < MIN_HOLE_TOKENS:
        raise ActionError(
            f"the selection is too long for one canvas (about {pinned_tokens + MIN_HOLE_TOKENS * len(holes)} tokens "
            f"with room for its {len(holes)} holes; the canvas holds {inp.max_canvas}): select less"
        )
    return ActionPlan(
        inp.action,
        start,
        end,
        ctx,
        original_text=text[start:end],
        middle=[Hole(width) if p is None else p for p in pinned],
        max_tokens=inp.max_canvas,
        holes=holes,
        hole_indents=[_block_indent(text, hole.start) for hole in holes],
    )


def plan_rewrite(inp: ActionInput) -> ActionPlan:
    """The selection regenerated from a warm start of itself (Rewrite: a function's signature pinned).
    Regenerate the unsure parts starts the same way; its handler scores the selection and pins the rest."""
    ctx = _selection_context(inp)
    text, start, end = inp.text, inp.start, inp.end
    header, warm = "", text[start:end]
    found = selected_function(inp.source, start, end)
    if inp.action == "rewriteSelection" and found is not None:
        _, _, bs, _ = found
        if text[start:bs].strip():  # everything up to the body: the signature stays as written
            cut = header_end(text, bs)
            header, warm = text[start:cut], text[cut:end]
    pinned, body = (inp.count(header) if header else 0), inp.count(warm)
    room = inp.max_canvas - pinned
    if body + SLACK_TOKENS > room:
        # A rewrite is cut at the canvas's end; replacing the whole selection with that would lose code.
        raise ActionError(
            f"the selection is too long for one canvas (about {pinned + body} tokens; "
            f"the canvas holds {inp.max_canvas}): select less"
        )
    budget = min(room, int(body * 1.5) + SLACK_TOKENS)
    return ActionPlan(
        inp.action,
        start,
        end,
        ctx,
        original_text=text[start:end],
        middle=[header, Hole(budget)] if header else [],
        max_tokens=budget,
        warm_start=warm,
        instruction=inp.instruction,
    )


# One planner per action (TITLES names them for the user).
PLANNERS: dict[str, Callable[[ActionInput], ActionPlan]] = {
    "fillHole": plan_fill_hole,
    "completeFunction": plan_complete_function,
    "fillSelectionHoles": plan_fill_selection_holes,
    "rewriteSelection": plan_rewrite,
    "regenerateUnsure": plan_rewrite,
}


def _opened_plan(inp: ActionInput, start: int, end: int, lead: str, trail: str, indent: str) -> ActionPlan:
    """A plan that writes new lines in place of [start, end): `lead` (a line break and the first line's
    indentation) and `trail` go around the fill, and the model reads the document already opened that way,
    its cursor after the lead. `indent`: the block the fill stays in (a line indented less leaves it)."""
    opened = inp.text[:start] + lead + trail + inp.text[end:]
    cursor = start + len(lead)
    ctx = inp.context(cursor, "multiline", (cursor, cursor), text=opened)
    ctx.indent = indent
    return ActionPlan(inp.action, start, end, ctx, max_tokens=inp.max_canvas, lead=lead, trail=trail)


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
        edits = _split_holes(plan, result_text, token_scores)
        if _breaks_code(plan, _applied(plan, edits)):
            raise ActionError(BREAKS_CODE_FILL)
        return edits
    if plan.action in ("rewriteSelection", "regenerateUnsure"):
        text = normalize_newlines(result_text, ctx.newline)
        if not text.strip():
            raise ActionError("the model returned nothing for the selection")
        if not writes_code(text, ctx.lang) and writes_code(plan.original_text, ctx.lang):
            raise ActionError(NO_CODE)
        new = _keep_outer_ws(text, plan.original_text)
        if new == plan.original_text:  # the next candidate may differ; else a note, not a silent edit
            raise NothingToChange("the model's rewrite is the selection as it was; nothing was changed")
        if _breaks_code(plan, new):  # the next candidate, else this error, is the answer
            raise ActionError(BREAKS_CODE)
        lost = [] if plan.instruction else _lost_functions(plan, new)
        if lost:  # `def mul` written as `def div`: the calls elsewhere would break
            raise ActionError(f"the model's rewrite renames or drops {', '.join(lost)}; nothing was changed")
        return [(plan.start, plan.end, new)]
    # fillHole / completeFunction
    if plan.action == "completeFunction":
        text = clean(result_text, ctx)
    else:
        post = post_context(ctx)
        text = hole_chain(post).run(result_text, post).text
    if text is None:
        raise ActionError("the model produced nothing usable here")
    text = close_what_it_opened(text, ctx.lang, _first_line_indent(ctx))
    if not text.strip():
        raise ActionError("the model produced nothing usable here")
    if not writes_code(text, ctx.lang):
        raise ActionError(NO_CODE)
    if plan.lead or plan.trail:  # the lead ends with the first line's indentation: the fill starts after it
        text = _closer_lead(plan, text) + text.lstrip(" \t") + plan.trail
    elif plan.action == "fillHole":
        if ctx.prefix.endswith((" ", "\t")) and not plan.original_text[:1].isspace():
            text = text.lstrip(" \t")  # the hole sits after its line's indentation: so does the fill
        text = fit_whitespace(text, plan.original_text, ctx.newline, ctx.indent)
    if _breaks_code(plan, text):  # `..` for a `pass`, an `else:` with no `if`
        raise ActionError(BREAKS_CODE_FILL)
    return [(plan.start, plan.end, text)]


def _breaks_code(plan: ActionPlan, new: str) -> bool:
    """Whether `new` in place of the plan's span makes the code around it worse than the old text did, in the
    top-level statement it edits (`_window`): more syntax errors touching the edit in tree-sitter's parse (a
    stray `}`, `..` for a `pass`; a half-typed line elsewhere neither turns the check off nor counts against
    the edit), for a rewrite brackets that no longer balance as the selection's did (the parse would close a
    dropped `}` at its window's end), or Python that no longer compiles where it did (an unindented block,
    an unexpected indent: tree-sitter tolerates both)."""
    lang = plan.ctx.lang
    window = _window(plan) if lang is not None else None
    if window is None:  # no grammar, or a statement longer than the document kept around the span
        return False
    before, after = window
    old = plan.original_text

    def errors(middle: str) -> int:
        return error_count(before + middle + after, lang, (len(before), len(before) + len(middle)))

    def brackets(middle: str) -> dict[str, int]:
        return bracket_balance(before + middle + after, lang, (len(before), len(before) + len(middle)))

    def compiles(middle: str) -> bool:
        try:
            ast.parse(before + middle + after)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        return True

    rewrite = plan.action in ("rewriteSelection", "regenerateUnsure")
    if errors(new) > errors(old) or (rewrite and brackets(new) != brackets(old)):
        return True
    return lang == "python" and compiles(old) and not compiles(new)


# A line that starts a top-level statement: at column 0, and not a closer (a brace language's function ends
# with its `}` there)
_TOP_LEVEL = re.compile(r"^[^\s)\]}]", re.M)


def _window(plan: ActionPlan) -> tuple[str, str] | None:
    """The code around the plan's span that its result is parsed in: the top-level statement the span is in
    (a window cut inside a class would be all errors, one cut inside a block would not compile), from its
    first line at column 0 to the next; a little past the span (`parse_window`'s) without a next one. None
    where the statement starts before the document kept around the span (`AROUND_BEFORE`)."""
    before, after = plan.around
    starts = [m.start() for m in _TOP_LEVEL.finditer(before)]
    if not starts and len(before) == AROUND_BEFORE:
        return None
    line_break = after.find("\n")
    end = _TOP_LEVEL.search(after, line_break + 1) if line_break >= 0 else None
    before = before[starts[-1] :] if starts else before
    return before, after[: end.start()] if end else parse_window("", after)[1]


def _lost_functions(plan: ActionPlan, new: str) -> list[str]:
    """The functions defined in the plan's span that `new` no longer defines there (by name): a rewrite
    keeps what the rest of the code calls, unless an instruction asked otherwise."""
    if plan.ctx.lang is None:
        return []
    before, after = _window(plan) or plan.around  # the statement it edits is enough to find them

    def names(middle: str) -> list[str]:
        return function_names(
            Source(before + middle + after, plan.ctx.lang), len(before), len(before) + len(middle)
        )

    kept = set(names(new))
    return [name for name in dict.fromkeys(names(plan.original_text)) if name not in kept]


def _applied(plan: ActionPlan, edits: list[tuple[int, int, str]]) -> str:
    """The plan's span with `edits` (document offsets inside it, in order) applied."""
    out, at = [], plan.start
    for start, end, text in edits:
        out += [plan.original_text[at - plan.start : start - plan.start], text]
        at = end
    return "".join(out) + plan.original_text[at - plan.start :]


def _closer_lead(plan: ActionPlan, text: str) -> str:
    """The lead, unless the fill's first line closes a bracket (`}` after the last line of an `if` block, at
    whose line's end the cursor was): that line goes to the indentation of the line that opened it, not to
    the cursor's statement's (which the lead typed)."""
    lead, first = plan.lead, text.lstrip(" \t")[:1]
    prefix = plan.ctx.prefix
    if first not in CLOSERS or not lead.startswith(("\n", "\r\n")) or not prefix.endswith(lead):
        return lead
    indent = opener_indent(prefix[: len(prefix) - len(lead)], first, plan.ctx.lang)
    return lead if indent is None else lead[: len(lead) - len(lead.lstrip("\r\n"))] + indent


def _first_line_indent(ctx: FillContext) -> str:
    """Where a fill's first line stands: after the indentation the cursor's line (or the lead) has typed,
    else at the block's."""
    typed = ctx.prefix[ctx.prefix.rfind("\n") + 1 :]
    return typed if typed and not typed.strip() else ctx.indent


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
