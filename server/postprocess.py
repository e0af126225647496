"""Turn the model's raw middle into something worth showing: a chain of named rules over one state.

As llama.cpp chains its samplers, a fill goes down an ordered list of small rules (`Rule`: a name and a pure
function of the text and the `PostContext`), each doing one thing: cut at the suffix overlap, keep the
line, balance the brackets, drop a copy of the line above, ... A rule that returns None drops the fill and
ends the chain. The chain is built per request from what the context says (`inline_chain`, `hole_chain`):
a rule that does not apply there is not in it. The state records which rules changed the text
(`State.trace`, logged at debug level), so a suggestion can be explained rule by rule.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from dfim.server.context import FillContext
from dfim.server.lines import is_word_char
from dfim.server.post_context import PostContext, post_context
from dfim.server.rules import (
    balance_brackets,
    cut_loop,
    cut_repeat_of_line_start,
    cut_repeated_line_end,
    cut_stutter,
    cut_to_parsing_lines,
    drop_duplicate_quote,
    fit_new_line_indent,
    fit_typed_indent,
    is_repetitive,
    limit_scope,
    normalize_newlines,
    remove_suffix_overlap,
    trim_repeated_operator,
    trim_space_after_opener,
)

log = logging.getLogger("dfim.server")


@dataclass(frozen=True)
class Rule:
    name: str  # what the trace shows
    apply: Callable[[str, PostContext], str | None]  # the new text; None: nothing worth showing


@dataclass
class State:
    """One fill going down a chain: its text (None once a rule dropped it), the context every rule reads, and
    the names of the rules that changed the text, in order."""

    text: str | None
    ctx: PostContext
    trace: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Chain:
    rules: tuple[Rule, ...]

    @property
    def names(self) -> list[str]:
        return [rule.name for rule in self.rules]

    def run(self, raw: str, ctx: PostContext) -> State:
        state = State(raw, ctx)
        for rule in self.rules:
            text = rule.apply(state.text, ctx)
            if text != state.text:
                state.trace.append(rule.name)
            state.text = text
            if text is None:
                break
        return state


# ---- the rules that read only the context (the text rules are in dfim.server.rules) --------------------


def drop_broken_characters(text: str, ctx: PostContext) -> str:
    """No NUL, and no U+FFFD (a broken byte sequence from a backend) unless the user's text has one."""
    text = text.replace("\x00", "")
    if "\ufffd" in text and "\ufffd" not in ctx.prefix + ctx.suffix:
        text = text.replace("\ufffd", "")
    return text


def cut_loop_unless_it_breaks(text: str, ctx: PostContext) -> str:
    """`cut_loop`, kept only if it adds no syntax error (the cut would leave a bracket open)."""
    looped = cut_loop(text, ctx.lang)
    if looped != text and looped.strip() and ctx.lang is not None and ctx.errors(looped) > ctx.errors(text):
        looped = text
    return looped or text


def drop_blank(text: str, ctx: PostContext) -> str | None:
    return text if text.strip() else None


def drop_repetitive(text: str, ctx: PostContext) -> str | None:
    return None if is_repetitive(text) else text


def _one_line_copy(text: str, line: str) -> bool:
    body = text.strip()
    return "\n" not in text and "\r" not in text and len(body) > 3 and body == line


def drop_copy_of_line_above(text: str, ctx: PostContext) -> str | None:
    """A one-line fill on a blank line that writes the line above it again."""
    return None if _one_line_copy(text, ctx.repeat_above) else text


def drop_repeat_of_line_above(text: str, ctx: PostContext) -> str | None:
    """A several-line fill on a blank line whose first lines write the line of code above it again
    (`rows.append(row)` once more after `rows.append(row)`): those lines go; with nothing else left, the
    fill shows nothing."""
    above = ctx.repeat_above
    if len(above) <= 3:
        return text
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    end = first
    while end < len(lines) and lines[end].strip() == above:
        end += 1
    if end == first:
        return text
    kept = lines[:first] + lines[end:]
    if first == 0 and kept:  # the fill began on the cursor's line, after its indentation: so does the rest
        kept[0] = kept[0].lstrip(" \t")
    rest = "\n".join(kept)
    return rest if rest.strip() else None


def drop_copy_of_line_below(text: str, ctx: PostContext) -> str | None:
    """A one-line fill that writes the next line of code."""
    return None if _one_line_copy(text, ctx.following.strip()) else text


def drop_start_of_what_follows(text: str, ctx: PostContext) -> str | None:
    """A single-line fill that is only the start of the text after the cursor (`BUCK▮ETS = ...` filled
    with `ETS`): inserting it duplicates what is already there."""
    body = text.strip()
    return None if body and ctx.rest_of_line.lstrip().startswith(body) else text


def drop_end_of_what_follows(text: str, ctx: PostContext) -> str | None:
    """A single-line fill that is the end of the text after the cursor (`"a" + ▮ + "-end";` filled with
    `"-end";`), three characters or more besides spaces: inserting it writes that end twice."""
    body = text.strip()
    rest = ctx.rest_of_line.rstrip()
    return None if len(body.replace(" ", "")) >= 3 and rest.endswith(body) else text


def drop_glued_to_the_next_word(text: str, ctx: PostContext) -> str | None:
    """A single-line fill before a word of the line (not inside one) that ends in a word character: the two
    run together into a name nobody wrote (`(this.h + this.h▮this.w` -> `this.hthis`)."""
    return None if is_word_char(text[-1:]) and is_word_char(ctx.rest_of_line[:1]) else text


def drop_new_syntax_errors(text: str, ctx: PostContext) -> str | None:
    """A single-line fill into code that goes on after the cursor, where the code around it parses without
    the fill (or with a name in its place: `"a" + ▮)`) and not with it (`users.find(id, id▮(u) => u.id ===
    id)`): it breaks code the user did not ask to change. Where the code is broken already (a line being
    typed: `forEach(next: (value:▮;`), counts of errors say little (one error region may become two as the
    fill mends it), so the fill stays."""
    return None if ctx.baseline_errors() == 0 and ctx.errors(text) > 0 else text


def _indent_must_fit(ctx: PostContext) -> bool:
    """Whether a one-line fill's leading indentation must fit the line above (`fit_typed_indent`): after
    indentation the user typed, and at a line's start with nothing typed where an indent can only be wrong:
    the top of a file, and Python outside brackets (an unexpected indent does not parse there; in other
    languages a continuation line, `.filter(...)` below `return xs`, is indented by choice)."""
    if ctx.before_on_line:
        return ctx.before_on_line.isspace()
    return not ctx.line_above.strip() or (ctx.lang == "python" and not ctx.outer)


def inline_chain(ctx: PostContext, max_lines: int = 40) -> Chain:
    """The rules for an inline fill (and `completeFunction`), in order, as they apply to this context: scope,
    loops, suffix overlap, quotes, brackets, usefulness, then the line's indentation."""
    line = ctx.mode == "line"
    rules = [
        Rule("drop_broken_characters", drop_broken_characters),
        Rule("limit_scope", lambda t, c: limit_scope(t, c, max_lines)),
        Rule("cut_stutter", lambda t, c: cut_stutter(t, c.lang)),
    ]
    if not line:
        rules += [
            Rule("cut_loop", cut_loop_unless_it_breaks),
            Rule("drop_repeat_of_line_above", drop_repeat_of_line_above),
            Rule("cut_to_parsing_lines", lambda t, c: cut_to_parsing_lines(t, c, max_lines)),
        ]
    if line and not ctx.opens_line:
        rules.append(
            Rule("cut_repeat_of_line_start", lambda t, c: cut_repeat_of_line_start(t, c.before_on_line))
        )
        if not ctx.lead and ctx.before_on_line.strip():
            rules.append(
                Rule("trim_space_after_opener", lambda t, c: trim_space_after_opener(t, c.before_on_line))
            )
            rules.append(
                Rule(
                    "trim_repeated_operator",
                    lambda t, c: trim_repeated_operator(t, c.before_on_line, c.rest_of_line),
                )
            )
    rules.append(Rule("remove_suffix_overlap", lambda t, c: remove_suffix_overlap(t, c.suffix)))
    if line:
        rules.append(Rule("drop_duplicate_quote", lambda t, c: drop_duplicate_quote(t, c.rest_of_line)))
    if line and ctx.in_word:
        rules.append(Rule("cut_repeated_line_end", lambda t, c: cut_repeated_line_end(t, c.rest_of_line)))
    # A line that ends with what it opens (`if (x) {`, `foo(`) is closed at its end, unless the code after
    # it is indented deeper: there the block or the arguments are already written, closer included.
    rules.append(
        Rule(
            "balance_brackets",
            lambda t, c: balance_brackets(
                t,
                c.outer,
                c.may_close,
                close_open=c.ends_line and not c.body_follows,
                in_string=c.in_string,
                rest_of_line=c.rest_of_line,
                in_placeholder=c.in_placeholder,
                line_opened=c.line_opened,
                one_line=line,
            ),
        )
    )
    if not line or ctx.ends_line:
        rules.append(Rule("strip_trailing_space", lambda t, c: t.rstrip()))
    if ctx.newline != "\n":
        rules.append(Rule("normalize_newlines", lambda t, c: normalize_newlines(t, c.newline)))
    rules += [
        Rule("drop_blank", drop_blank),
        Rule("drop_repetitive", drop_repetitive),
        Rule("drop_copy_of_line_above", drop_copy_of_line_above),
        Rule("drop_copy_of_line_below", drop_copy_of_line_below),
    ]
    if line and not ctx.opens_line:
        rules.append(Rule("drop_start_of_what_follows", drop_start_of_what_follows))
        rules.append(Rule("drop_end_of_what_follows", drop_end_of_what_follows))
    if line and not ctx.ends_line:  # code goes on after the cursor: the fill must not spoil it
        if not ctx.in_word:
            rules.append(Rule("drop_glued_to_the_next_word", drop_glued_to_the_next_word))
        if ctx.lang is not None:
            rules.append(Rule("drop_new_syntax_errors", drop_new_syntax_errors))
    if line and not (ctx.lead or ctx.opens_line) and _indent_must_fit(ctx):
        rules.append(Rule("fit_typed_indent", fit_typed_indent))
    if ctx.opens_line:  # the code after the cursor moves down a line, keeping its indentation
        rules += [
            Rule("fit_new_line_indent", fit_new_line_indent),
            Rule("open_line_above", lambda t, c: t + c.newline + c.before_on_line),
        ]
    if ctx.lead:  # the model wrote after the indentation dfim typed: the suggestion starts with it
        rules.append(Rule("start_with_lead", lambda t, c: c.lead + t.lstrip(" \t")))
    return Chain(tuple(rules))


def hole_chain(ctx: PostContext, max_lines: int = 200) -> Chain:
    """The rules for `fillHole`: the scope and the several-line trims only (the action closes what the fill
    opened and fits it to the hole itself)."""
    return Chain(
        (
            Rule("limit_scope", lambda t, c: limit_scope(t, c, max_lines)),
            Rule("cut_loop", cut_loop_unless_it_breaks),
            Rule("cut_to_parsing_lines", lambda t, c: cut_to_parsing_lines(t, c, max_lines)),
            Rule("normalize_newlines", lambda t, c: normalize_newlines(t, c.newline)),
            Rule("drop_blank", drop_blank),
        )
    )


def as_post(ctx: FillContext | PostContext) -> PostContext:
    return ctx if isinstance(ctx, PostContext) else post_context(ctx)


def clean(raw: str, ctx: FillContext | PostContext) -> str | None:
    """The fill after the inline chain; None = show nothing. A `FillContext` is read once for this fill; a
    request with several fills works out its `PostContext` once and passes it."""
    ctx = as_post(ctx)
    state = inline_chain(ctx).run(raw, ctx)
    log.debug("post-processing %.60r -> %.60r by %s", raw, state.text, ", ".join(state.trace) or "no rule")
    return state.text


def without_breaking(candidates: list[str], ctx: FillContext | PostContext) -> list[str]:
    """`candidates` (ranked) less those that bring syntax errors where they go, when one at least does not:
    alternatives the user cycles through (an unclosed string, a stray `)`) are not worth a look once a clean
    one is there. All of them where every one breaks something (the first is the model's best guess)."""
    ctx = as_post(ctx)
    if len(candidates) < 2 or ctx.lang is None:
        return candidates
    clean = [c for c, new in zip(candidates, _new_errors(candidates, ctx), strict=True) if new == 0]
    return clean or candidates


def _new_errors(candidates: list[str], ctx: PostContext) -> list[int]:
    """The syntax errors each candidate brings where it goes, beyond those already there. The rules' counter:
    parsed in a window around the fill and remembered per text, so a candidate the rules already parsed costs
    nothing here (a whole-document parse per candidate cost ~2 ms each)."""
    base = ctx.baseline_errors()
    return [max(0, ctx.errors(c) - base) for c in candidates]


def rank_candidates(candidates: list[str], ctx: FillContext | PostContext) -> list[str]:
    """Cleaned, deduplicated candidates; those that parse without new syntax errors first, model order kept
    otherwise."""
    ctx = as_post(ctx)
    chain = inline_chain(ctx)
    seen: set[str] = set()
    cleaned: list[str] = []
    for raw in candidates:
        state = chain.run(raw, ctx)
        log.debug(
            "post-processing %.60r -> %.60r by %s", raw, state.text, ", ".join(state.trace) or "no rule"
        )
        if state.text is not None and state.text not in seen:
            seen.add(state.text)
            cleaned.append(state.text)
    if len(cleaned) < 2 or ctx.lang is None:
        return cleaned
    scored = sorted((new, i) for i, new in enumerate(_new_errors(cleaned, ctx)))
    return [cleaned[i] for _, i in scored]
