"""Unit tests of server/windows.py: context windows cut on whole lines, on the document's grid, within budget."""

from __future__ import annotations

from dfim.server import context, languages, windows
from tests.server.helpers import split


def test_windows_cut_on_whole_lines_preferring_top_level_ones():
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))
    text = body + "def target(x):\n    return |\n" + body
    text, cursor = split(text)
    ctx = context.build_context(text, cursor, "python", prefix_tokens=100, suffix_tokens=60)
    assert ctx.prefix.startswith("def f") and len(ctx.prefix) < 100 * 3 + 10
    assert ctx.suffix.endswith("\n") and ctx.suffix.rstrip().endswith(tuple(f"+ {i}" for i in range(200)))
    # with a real token counter the windows fit the budgets
    ctx = context.build_context(text, cursor, "python", prefix_tokens=50, suffix_tokens=30, count_tokens=len)
    assert len(ctx.prefix) <= 50 and len(ctx.suffix) <= 30
    assert ctx.prefix.startswith("def ") or ctx.prefix.startswith("    ")


def shipped_token_count():
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR
    from dfim.engine.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(DEFAULT_MODEL_DIR / "tokenizer.json")
    return lambda text: len(tokenizer.encode(text))


def _typing(text: str, at: int, typed: str, step: int = 3):
    """(document, cursor) after each `step` characters of `typed` are inserted at `at`."""
    for k in range(step, len(typed) + 1, step):
        yield text[:at] + typed[:k] + text[at:], at + k


def test_windows_stay_put_while_the_user_types():
    # decision 43: the engine re-encodes from the first context token that changed, and the suffix comes
    # first, so windows that moved with the cursor or with the half-typed line's parse cost a re-encode
    body = "".join(f"def f{i}(x):\n    y = [x, {i}]\n    return y\n\n" for i in range(300))
    at = len(body) // 2
    at = body.index("\n", at) + 1
    typed = "    values = compute(alpha, [beta, gamma], {'k': delta})\n    total = sum(values) + offset(\n"
    count = shipped_token_count()
    contexts = [
        context.build_context(doc, cur, "python", prefix_tokens=200, suffix_tokens=100, count_tokens=count)
        for doc, cur in _typing(body, at, typed)
    ]
    suffixes = {c.suffix for c in contexts}
    starts = [c.start - len(c.prefix) for c in contexts]
    assert len(suffixes) == 1  # open brackets and all: the text after the cursor is read the same way
    cell = 200 * windows.CHARS_PER_TOKEN / windows.GRID_CELLS
    assert 1 < len(set(starts)) <= 1 + len(typed) / cell  # at most one move per cell typed
    assert all(count(c.prefix) <= 200 and count(c.suffix) <= 100 for c in contexts)  # within the budgets
    assert all(count(c.prefix) >= 200 * 0.75 and count(c.suffix) >= 100 * 0.75 for c in contexts)  # used
    assert all(c.prefix.startswith(("def f", "    ")) and c.suffix.endswith("\n") for c in contexts)  # lines


def test_windows_are_cut_on_the_documents_grid_not_the_parsed_regions():
    # only a region around the cursor is parsed; the windows must not depend on where that region starts
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(4000))
    for cursor in (len(body) // 3, len(body) // 3 + 1, len(body) // 2 + 7):
        far = context.build_context(body, cursor, "python", prefix_tokens=300, suffix_tokens=100)
        near = windows.fit_window(languages.Source(body, "python"), cursor, cursor, 300, 100)
        assert (far.start - len(far.prefix), far.end + len(far.suffix)) == near


def test_dense_text_keeps_a_full_window_and_never_breaks_the_context():
    # review of decision 43: budgets under one grid cell crashed (IndexError), and CJK/emoji text stepped
    # the windows down to nothing
    count = shipped_token_count()
    for budgets in ((339, 169), (1024, 256)):
        for n in range(1, 300, 7):
            text = "s = '" + "\U0001f600" * n
            ctx = context.build_context(text, len(text), "python", *budgets, count_tokens=count)
            assert count(ctx.prefix) <= budgets[0] and text.endswith(ctx.prefix)
    cjk = "".join(f"# 第{i}行的注释，说明这个函数做什么\nx{i} = {i}\n" for i in range(400))
    cursor = len(cjk) // 2
    ctx = context.build_context(cjk, cursor, "python", 256, 128, count_tokens=count)
    assert 256 * 0.6 <= count(ctx.prefix) <= 256 and 128 * 0.6 <= count(ctx.suffix) <= 128


def test_crlf_windows_start_where_lf_windows_do():
    body = "".join(f"def f{i}(x):\n    y = x + {i}\n    return y\n\n" for i in range(300))
    cursor = body.index("def f150")
    lf = context.build_context(body, cursor, "python", 300, 100)
    crlf_text = body.replace("\n", "\r\n")
    crlf = context.build_context(crlf_text, crlf_text.index("def f150"), "python", 300, 100)
    assert lf.prefix.startswith("def f") and crlf.prefix.startswith("def f")


def test_a_large_budget_keeps_its_window_while_the_user_types():
    # the parsed region is sized for the widest window tried, so the window stays on the document's grid
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(6000))
    at = body.index("def f5000")
    count = shipped_token_count()
    starts = {
        c.start - len(c.prefix)
        for doc, cur in _typing(body, at, "    total = compute(alpha)\n", step=6)
        for c in [context.build_context(doc, cur, "python", 6000, 256, count_tokens=count)]
    }
    assert len(starts) <= 2


def test_windows_without_grammar_cut_at_lines():
    text = "\n".join(f"line {i} of the file" for i in range(500))
    cursor = text.index("line 250") + 4
    ctx = context.build_context(text, cursor, None, prefix_tokens=40, suffix_tokens=40)
    assert ctx.prefix.startswith("line ") and ctx.suffix.endswith("\n")


def test_context_budget_fits_the_trained_context() -> None:
    from dfim.engine.model.tokenizer import FIM_SPECIALS
    from dfim.server.windows import fit_context_budget

    # The shipped model was trained on 512 context tokens, suffix at most a third of them.
    prefix, suffix = fit_context_budget(1024, 256, 512)
    assert prefix + suffix + FIM_SPECIALS <= 512 and suffix <= 508 // 3 and prefix > 2 * suffix - 4
    assert fit_context_budget(1024, 256, None) == (1024, 256)  # a checkpoint that says nothing
    assert fit_context_budget(200, 100, 512) == (200, 100)  # already fits
    assert fit_context_budget(1024, 0, 512) == (508, 0)  # no suffix wanted: all room to the prefix
    assert fit_context_budget(1024, 256, 3) == (2, 0)  # absurd lengths still give a valid budget
