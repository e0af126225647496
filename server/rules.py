"""The post-processing rules: pure functions of a fill's text and what they read of its context.

Peers' top complaints are duplicated suffixes and brackets, and suggestions that run past the block the
user is in. Each rule here does one thing to a fill's text; `dfim.server.postprocess` chains them, in order,
over a `PostContext` worked out once per request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dfim.engine.layout import CLOSER_OF, CLOSERS, MATCH, OPENERS, leading_ws, scan_brackets, statement_indent
from dfim.server.context import FillContext
from dfim.server.lines import indent_width, is_word_char, split_lines
from dfim.server.post_context import PostContext

_REPEAT = re.compile(r"(.{1,12}?)\1{3,}", re.S)


def balance_brackets(
    completion: str,
    outer: Sequence[str],
    may_close: int,
    close_open: bool = False,
    in_string: str = "",
    rest_of_line: str = "",
    in_placeholder: bool = False,
    line_opened: int = 0,
    one_line: bool = False,
) -> str:
    """Cut the completion at the first closing bracket that the suffix already provides or that closes
    nothing (it may close `may_close` of the `outer` brackets open before it, innermost last); with
    `close_open`, append closers for brackets the completion left open. `in_string`: the quote the cursor
    is inside; the completion's text up to that quote's end is the string's, and its brackets close nothing
    (`"/{v1` filled with `:[0-9]{3}}"`), except in a placeholder (`in_placeholder`: `f"{▮}"`, `` `${▮}` ``)
    whose `}` the line already holds: there the completion ends before the `}` that would close it again.
    A completion that leaves the brackets open as they were is kept whole (`} catch (E e) {`), and so is
    one before code on its line (`rest_of_line`, such as the `)` an editor that closes brackets leaves)
    where that code then closes what it reopened and nothing more than was open before it: `expect(▮);`
    filled with `n).toBe(1`. Where that code closes what its line opened before the cursor (`line_opened`
    of `outer`), it must still close them after the completion: `fold(0, |acc, x| ▮)` filled with
    `x.get_u(` would take the `)` of `fold(`, and is dropped; so is one that leaves that code closing a
    bracket of another kind (`reduce((a, x) => ▮, 0)` filled with `{`: `{, 0)`), or go on inside what it
    opened (`=> ▮;` filled with `{`). These three for a `one_line` fill only: a block's fill may leave its
    last statement's block open for the lines still to come. A completion that ends with a block's `{` is
    left open: the block's lines come next (`if x == 0 {}` is never meant)."""
    given, outer = tuple(outer), list(outer)
    own: list[str] = []
    start = 0
    if in_string:
        if in_placeholder and rest_of_line.lstrip().startswith("}"):
            depth = 0
            for i, c in enumerate(completion):
                depth += (c == "{") - (c == "}")
                if depth < 0:
                    return completion[:i].rstrip(" \t")
        end = re.search(r"(?<!\\)(?:\\\\)*" + re.escape(in_string), completion)
        if end is None:
            return completion  # all of it is inside the string
        start = end.end()
    if _leaves_open(completion[start:], outer) == outer:
        return completion  # what it closes it opens again (`} else {`): the code after reads the same
    rest = rest_of_line.strip() != ""
    # what the code after the cursor leaves open when it closes its own line's brackets, which it must then
    # still close after the completion (None: no such duty)
    duty = None
    if rest and line_opened and one_line:
        rest_left = _leaves_open(rest_of_line, outer)
        duty = rest_left if rest_left == outer[: len(outer) - line_opened] else None
    if rest:
        left = _leaves_open(completion[start:] + rest_of_line, outer)
        if left is not None and left == outer[: len(left)] and (duty is None or left == duty):
            return completion
    for i, c in scan_brackets(completion[start:]):
        i += start
        if c in OPENERS:
            own.append(c)
        elif own and own[-1] == MATCH[c]:
            own.pop()
        elif not own and may_close > 0 and outer and outer[-1] == MATCH[c]:
            outer.pop()
            may_close -= 1
        else:  # a mismatched closer, or one the suffix provides / that closes nothing: cut, then close
            completion = completion[:i].rstrip(" \t")
            break
    if close_open and own and not completion.rstrip().endswith("{"):
        completion = completion.rstrip() + "".join(CLOSER_OF[c] for c in reversed(own))
    elif rest and one_line:
        before = given  # the loop above took from `outer` what the completion closes
        after = completion[start:] + rest_of_line
        if _mismatches(after, before) and not _mismatches(rest_of_line, before):
            return ""  # the code after it on its line would close a bracket of another kind that it opened
        if duty is not None and _leaves_open(after, before) != duty:
            return ""  # it takes a closer its line's own bracket needs
        if _opens_past_the_line(completion[start:], rest_of_line):
            return ""  # the code after it on its line would go inside what it opened (`=> {;`)
    return completion


def _opens_past_the_line(completion: str, rest_of_line: str) -> bool:
    """Whether a bracket the completion opens is still open at the end of its line, the code after it
    included."""
    stack: list[bool] = []  # per open bracket: whether the completion opened it
    for i, c in scan_brackets(completion + rest_of_line):
        if c in OPENERS:
            stack.append(i < len(completion))
        elif stack:
            stack.pop()
    return any(stack)


def _walk(text: str, outer: Sequence[str]) -> tuple[list[str], bool, bool]:
    """(the brackets open after `text`, the `outer` ones open before it first; whether a closer met an opener
    of another kind; whether a closer met none): one pass for `_mismatches` and `_leaves_open`."""
    stack = list(outer)
    mismatched = unopened = False
    for _, c in scan_brackets(text):
        if c in OPENERS:
            stack.append(c)
        elif not stack:
            unopened = True
        elif stack.pop() != MATCH[c]:
            mismatched = True
    return stack, mismatched, unopened


def _mismatches(text: str, outer: Sequence[str]) -> bool:
    """Whether a closer in `text` meets an opener of another kind (`{)`), the `outer` ones open before it
    (running out of openers is no mismatch: the code above may hold them)."""
    return _walk(text, outer)[1]


def _leaves_open(text: str, outer: Sequence[str]) -> list[str] | None:
    """The brackets open after `text` that come after the `outer` ones open before it (None at a closer
    that matches nothing)."""
    stack, mismatched, unopened = _walk(text, outer)
    return None if mismatched or unopened else stack


def _same_line(line: str, suffix_line: str, indented: bool) -> bool:
    """Whether a fill's line repeats a line of the suffix. A line of closers only (`}`, `});`) repeats it only
    at the same indentation: at another, it closes an inner block of the fill's own."""
    code = line.strip()
    if code != suffix_line.strip():
        return False
    if indented and not code.strip(CLOSERS + ";,"):
        return indent_width(line) == indent_width(suffix_line)
    return True


def remove_suffix_overlap(completion: str, suffix: str) -> str:
    """Drop the completion's tail where it repeats the start of the suffix: whole lines, or the rest of the
    cursor's line (`if x > ▮:` filled with `0:`). A lone bracket or quote there is left to bracket balancing
    and `drop_duplicate_quote`, which know whether the fill opened its own."""
    lines = split_lines(completion)
    suffix_lines = split_lines(suffix.lstrip("\r\n"))
    whole = suffix[:1] in ("\n", "\r")  # the suffix's first line is a whole line, indentation included
    # whole trailing lines that are the suffix's first lines
    for k in range(min(len(lines) - 1, len(suffix_lines), 20), 0, -1):
        tail = lines[-k:]
        if all(s.strip() for s in tail) and all(
            _same_line(a, b, whole or j > 0)
            for j, (a, b) in enumerate(zip(tail, suffix_lines[:k], strict=True))
        ):
            cut = len("\n".join(lines[:-k]))
            completion = completion[:cut].rstrip("\r\n")
            break
    rest = split_lines(suffix)[0].strip()
    if len(rest) >= 2 or (len(rest) == 1 and rest not in "()[]{}\"'`"):
        stripped = completion.rstrip()
        if stripped.endswith(rest):
            return stripped[: len(stripped) - len(rest)].rstrip(" \t") if stripped != rest else ""
    if "\n" not in completion and rest in ("{", "[", "(") and completion.rstrip().endswith(rest):
        # a one-line fill that ends by opening what the line opens right after it (`User | undefined {`
        # before the cursor's `{`) would open it twice: an opener, unlike a closer, is never the fill's own
        return completion.rstrip()[:-1].rstrip(" \t")
    # the completion ends with a long-enough prefix of the suffix (e.g. the suffix's next statement); not
    # a one-line fill that ends its line, which cannot run into the next one: a table's row may well end
    # as the row below begins (`NONA,  NONA,`)
    if "\n" not in completion and whole:
        return completion
    # Where the suffix starts a new line, so does the repeat: a line that merely ends as the next one
    # begins (`a, b = merged[-1]` above `merged[-1] = ...`) is not one.
    head = suffix.lstrip()
    for k in range(min(len(head), len(completion)), 5, -1):
        if completion.endswith(head[:k]) and head[:k].strip():
            kept = completion[: len(completion) - k]
            if whole and kept.rstrip(" \t")[-1:] not in ("\n", ""):
                continue
            return kept
    return completion


def cut_repeat_of_line_start(completion: str, before_on_line: str, min_chars: int = 8) -> str:
    """A small model sometimes writes the cursor's line again from a point before the cursor: after
    `runes[i], runes[j] = ` it writes `runes[i], runes[j] = runes[j], runes[i]`, after `User | undefined `
    it writes `| undefined`. Drop such a head: the longest tail of the text before the cursor, from a word's
    start, of `min_chars` or more characters besides spaces, that the completion starts with."""
    line = before_on_line
    for i in range(len(line)):
        tail = line[i:].rstrip()
        if len(tail.replace(" ", "")) < min_chars:
            break
        if line[i] in " \t" or (i and is_word_char(line[i - 1]) and is_word_char(line[i])):
            continue  # a space, or inside a word: not where a repeat begins
        if completion.startswith(tail) and len(completion) > len(tail):
            return completion[len(tail) :].lstrip(" \t")
    return completion


def cut_repeated_line_end(completion: str, rest_of_line: str) -> str:
    """Inside a word (`BUCK▮ETS = len(values)`) the model tends to write the line again: `S = len(values)`
    would give `BUCKS = len(values)ETS = len(values)`. Cut a tail of the completion that repeats the end of
    the line from a point after the word (4+ characters)."""
    rest = rest_of_line.rstrip()
    stripped = completion.rstrip()
    for j in range(len(rest)):
        if is_word_char(rest[j]):
            continue  # the rest of the word the cursor is in, or a later word: cut only at a boundary
        tail = rest[j:]
        if len(tail.strip()) >= 4 and stripped.endswith(tail):
            return stripped[: len(stripped) - len(tail)]
    return completion


def unescaped(text: str, quote: str) -> int:
    """How many times `quote` occurs in `text` unescaped (after an even number of backslashes)."""
    return len(re.findall(r"(?<!\\)(?:\\\\)*" + re.escape(quote), text))


def drop_duplicate_quote(completion: str, rest_of_line: str) -> str:
    """Drop a closing quote the rest of the line already has: at `f"Hi {name}▮"` a fill `!"` would leave
    `""`. And where an editor closed the quote and the bracket (`print("▮")`), a fill that closes the string
    and then that bracket (`Hello", 1)`) ends before its quote, or the line would end `1)")`. Only when the
    completion closes a string it did not open (an odd number of that quote in it)."""
    head = rest_of_line.lstrip()
    body = completion.rstrip()
    for quote in ('"""', "'''", '"', "'", "`"):
        if not head.startswith(quote) or unescaped(body, quote) % 2 == 0:
            continue
        if body.endswith(quote):
            return body[: len(body) - len(quote)]
        first = re.search(r"(?<!\\)(?:\\\\)*" + re.escape(quote), body)
        tail = body[first.end() :].rstrip(" ;,") if first else ""  # `Total: " + n);` closes the call too
        if tail and tail[-1] in CLOSERS and tail[-1] in head[len(quote) :]:
            return body[: first.end() - len(quote)]
    return completion


def limit_scope(completion: str, ctx: FillContext | PostContext, max_lines: int = 40) -> str:
    """Single-line fills keep their first line; multi-line fills stop at the first line that leaves the block:
    indented less than `ctx.indent` and, below a line that opens the block, not deeper than that line's
    statement (Google-style C++ puts ` public:` one space into a class whose members are two in). A C
    preprocessor line (`#if`, at column 0 wherever it is) leaves nothing."""
    lines = split_lines(completion)
    if ctx.mode == "line":
        return lines[0]
    base = indent_width(ctx.indent)
    above = ctx.prefix.rstrip()
    floor = base - 1
    if above.endswith(("{", ":")):
        floor = min(floor, indent_width(statement_indent(above[-20000:], ctx.lang)))
    kept = [lines[0]]
    for line in lines[1 : max_lines + 1]:
        if line.strip() and indent_width(line) <= floor:
            if not (ctx.lang in ("c", "cpp") and line.lstrip().startswith("#")):
                break
        kept.append(line)
    while len(kept) > 1 and not kept[-1].strip():
        kept.pop()
    return ctx.newline.join(kept) if len(kept) > 1 else kept[0]


# one name four times in a row (`total total total total`); names of two or more characters, outside strings
_STUTTER = re.compile(r"\b([A-Za-z_]\w+)(?:\s+\1\b){3,}")
_STRING = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'|`(?:[^`\\\n]|\\.)*`")


def code_of(line: str, lang: str | None) -> str:
    """A line without its strings' contents and its trailing comment, right-stripped."""
    code = _STRING.sub('""', line)
    code = code.split("#", 1)[0] if lang in (None, "python") else code.split("//", 1)[0]
    return code.rstrip()


_TRIPLE_STRING = re.compile(r'[rbuRBU]{0,2}("""|\'\'\')(?:.|\n)*?(?:\1|$)')
_BLOCK_COMMENT = re.compile(r"/\*(?:.|\n)*?(?:\*/|$)")
_LONE_STRING = re.compile(r"""^[rbufRBUF]{0,2}(?:"[^"]*"|'[^']*')[;,]?$""")


def writes_code(text: str, lang: str | None) -> bool:
    """Whether `text` holds a line of code: not only comments, docstrings or a lone string literal. An action
    asked for code must not answer with a comment that describes it (`# compute the mean`) and stop."""
    text = _TRIPLE_STRING.sub("", text) if lang in (None, "python") else _BLOCK_COMMENT.sub("", text)
    for line in text.splitlines():
        code = code_of(line, lang).strip()
        if code and not _LONE_STRING.match(code) and code != '""':
            return True
    return False


def cut_stutter(completion: str, lang: str | None = None) -> str:
    """Keep the lines before the first one where the model stutters (a word repeated four times in a row),
    the way a small model runs out of ideas at the end of a long canvas."""
    lines = split_lines(completion)
    in_docstring = False
    for i, line in enumerate(lines):
        if not in_docstring and _STUTTER.search(code_of(line, lang)):
            return "\n".join(lines[:i])
        if (line.count('"""') + line.count("'''")) % 2 == 1:  # prose inside a docstring is not code
            in_docstring = not in_docstring
    return completion


def cut_loop(completion: str, lang: str | None = None) -> str:
    """Keep the lines before the point where the fill starts repeating itself: a line written twice in a row,
    or a run of two or three lines written again right after itself (a small model looping over its own
    lines). Only exact repeats at the same indentation count, so real code that says the same thing in two
    branches (`i += 1`, `if err != nil {`) is left alone; a closing bracket or markup line may repeat. A
    block opener left without its body at the end goes too."""
    lines = split_lines(completion)
    code = [i for i, line in enumerate(lines) if line.strip()]  # indexes of the non-blank lines
    same = [lines[i].rstrip() for i in code]
    for j in range(1, len(code)):
        for n in (1, 2, 3):
            if j < 2 * n - 1 or same[j - n + 1 : j + 1] != same[j - 2 * n + 1 : j - n + 1]:
                continue
            if all(line.strip()[0] in ")]}<" for line in same[j - n + 1 : j + 1]):
                continue
            kept = lines[: code[j - n + 1]]
            while kept and (not kept[-1].strip() or code_of(kept[-1], lang).endswith((":", "{"))):
                kept.pop()
            return "\n".join(kept)
    return completion


_HEADER = re.compile(r"(if|elif|else|for|while|with|try|except|finally|def|class|switch|do)\b")


def _dangling_header(line: str, following: str, lang: str | None) -> bool:
    """A last line that opens a block (`if x > 3:`, `for (...) {`, a brace-less `if (t > 10)`) whose body is
    not the code after it (that is not indented deeper)."""
    if following.strip() and indent_width(following) > indent_width(line):
        return False
    code = code_of(line, lang)
    stripped = code.strip()
    return code.endswith((":", "{")) or (bool(_HEADER.match(stripped)) and not stripped.endswith((";", "}")))


UNREADABLE = 10  # syntax errors around an empty fill from which its parse says nothing about the fill's


def cut_to_parsing_lines(completion: str, ctx: PostContext, max_lines: int = 40) -> str:
    """A several-line fill cut after the line that leaves the fewest syntax errors (the longest such cut; a
    small model's tail is often half a statement), without a block header left bodiless at its end. Errors
    the document already has count the same for every cut, so an unfinished line above the cursor changes
    nothing. The fill as it is when no cut has fewer errors."""
    lines = split_lines(completion)
    if ctx.lang is None or len(lines) < 2 or len(lines) > max_lines:
        return completion
    errors = ctx.errors
    if errors("") >= UNREADABLE:
        return completion  # the code around it does not parse (a script in a string, macros): no guide
    best, fewest = len(lines), errors(completion)
    if fewest > errors(""):  # the whole fill adds an error: try shorter cuts
        for k in range(len(lines) - 1, 0, -1):
            head = "\n".join(lines[:k])
            if not head.strip():
                break
            if errors(head) < fewest:
                best, fewest = k, errors(head)
    kept = lines[:best]
    following = ctx.following
    while len(kept) > 1 and (
        not kept[-1].strip()
        or (_dangling_header(kept[-1], following, ctx.lang) and kept[-1].strip()[0] not in ")]}")
    ):
        kept.pop()
    if len(kept) < best and errors("\n".join(kept)) > fewest:
        kept = lines[:best]  # dropping the header would unbalance something: leave it
    return completion if kept == lines else "\n".join(kept)


def is_repetitive(completion: str) -> bool:
    """Degenerate output: one line repeated three times in a row, or a short unit repeated to fill most of
    the text."""
    lines = [s.strip() for s in split_lines(completion) if s.strip()]
    for i in range(len(lines) - 2):
        if lines[i] == lines[i + 1] == lines[i + 2]:
            return True
    squeezed = completion.strip()
    for m in _REPEAT.finditer(squeezed):
        if m.group(1).strip() and (m.end() - m.start()) * 2 >= len(squeezed) and len(squeezed) >= 12:
            return True
    return False


def normalize_newlines(completion: str, newline: str) -> str:
    return completion if newline == "\n" else re.sub(r"\r\n|\r|\n", newline, completion)


def fit_whitespace(fill: str, original: str, newline: str = "\n", indent: str = "") -> str:
    """Keep the replaced text's outer line structure: if it began with a line end (the inside of `{ ... }`)
    or ended with one (plus the closing line's indentation), so does the replacement. `indent` goes before
    a first line the model left unindented after that leading line end."""
    body = fill.strip("\r\n").rstrip()
    lead = re.match(r"[ \t]*(\r\n|\r|\n)", original)
    trail = re.search(r"(\r\n|\r|\n)[ \t]*\Z", original)
    if lead:
        if indent and body and not body[0].isspace():
            body = indent + body
        body = lead.group(1) + body
    if trail and (lead is None or trail.start() >= lead.end() or len(original.strip()) == 0):
        body = body + trail.group(0)
    return body


def fit_new_line_indent(text: str, ctx: PostContext) -> str:
    """A line opened above the code after the cursor, indented deeper than the line before it though that line
    opens nothing (no `:`, bracket, comma or backslash at its end) cannot be right (`    assert a == b` above
    a top-level `def`): it takes the indentation of the code it goes above. Any other indentation is the
    model's (a body line above a dedented `return` is deeper than the code after it, and rightly so)."""
    previous, opens = ctx.line_above, ctx.line_above_opens
    own = ctx.before_on_line + text[: len(text) - len(text.lstrip(" \t"))]
    if indent_width(own) <= indent_width(previous) or opens:
        return text
    rest = ctx.rest_of_line
    return rest[: len(rest) - len(rest.lstrip(" \t"))] + text.lstrip(" \t")


def fit_typed_indent(text: str, ctx: PostContext) -> str:
    """On a line where the user (or the editor) has typed the indentation, a fill that indents further is
    right only below a line that opens something, and only while the typed indentation is not already
    deeper than that line's: `\t` + `\tname = 1` after `func main() {` would be a line two tabs deep."""
    previous, opens = ctx.line_above, ctx.line_above_opens
    lead = text[: len(text) - len(text.lstrip(" \t"))]
    if not lead or (opens and indent_width(ctx.before_on_line) <= indent_width(previous)):
        return text
    if indent_width(ctx.before_on_line + lead) <= indent_width(previous):
        return text  # a dedent the model wrote out (not after typed indentation: rare) is its own
    return text.lstrip(" \t")


def trim_space_after_opener(completion: str, before_on_line: str) -> str:
    """A one-line fill right after an opener on its line starts without the model's indentation: none after
    `(` or `[` (`vec![  1, 2]`), at most one space after `{` (`&User{\tID: name}`, where `{ a: 1 }` is a
    style of its own)."""
    lead = leading_ws(completion)
    if not lead or not before_on_line.endswith(("(", "[", "{")):
        return completion
    if before_on_line.endswith("{"):
        return completion if lead == " " else " " + completion[len(lead) :]
    return completion[len(lead) :]


# Binary operators a one-line fill may write again on either side of the cursor; not `-` or `&` (a unary
# minus or an address-of after an operator is real code: `x - -1`, `f(a, &b)`)
_BINARY = ("&&", "||", "<<", ">>", "==", "!=", "+", "*", "/", "%", "|", ",")


def trim_repeated_operator(completion: str, before_on_line: str, rest_of_line: str) -> str:
    """A one-line fill between two operands does not repeat the operator typed before it or the one after
    it (`"item-" + ▮ + "-end"` filled with `+ "-" +` would read `+ + "-" + +`)."""
    before, rest = before_on_line.rstrip(), rest_of_line.lstrip()
    text = completion
    for op in _BINARY:
        if before.endswith(op) and text.lstrip().startswith(op + " "):
            text = text.lstrip()[len(op) :].lstrip()
            break
    for op in _BINARY:
        if rest.startswith(op) and text.rstrip().endswith(" " + op):
            text = text.rstrip()[: -len(op)].rstrip()
            break
    return text if text.strip() else completion
