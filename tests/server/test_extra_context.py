"""Unit tests of server/extra_context.py: the block of other files' definitions and chunks, its budget and
its comment form."""

from __future__ import annotations

from pathlib import Path

from dfim.engine.inference.extra_block import as_comment
from dfim.server.documents import DocumentStore
from dfim.server.extra_context import Extra, ExtraContext, uri_path, with_extra
from dfim.server.options import ExtraContextOptions, Options, merge_options

UTIL = '''import re


def slugify(text: str, sep: str = "-") -> str:
    """Turn text into a URL slug."""
    return re.sub(r"\\W+", sep, text).strip(sep).lower()


class Table:
    def __init__(self, rows: list[dict]):
        self.rows = rows

    def column(self, key: str) -> list:
        return [r[key] for r in self.rows]


def unused_helper(a, b):
    return a + b
'''

MAIN = """from pkg import slugify
from .util import Table, unused_helper


def run(rows):
    t = Table(rows)
    return [slugify(n) for n in t.column("name")]
"""


def chars(text: str) -> int:
    """A stand-in tokenizer: 1 token per 4 characters (the server's count before the model loads)."""
    return max(1, len(text) // 4)


def project(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .util import slugify\n")
    (tmp_path / "pkg" / "util.py").write_text(UTIL)
    (tmp_path / "pkg" / "main.py").write_text(MAIN)
    return tmp_path


def build(extra: ExtraContext, store: DocumentStore, doc, root: Path, budget: int, **kw) -> Extra:
    return extra.build(store.all(), [root], doc, doc.text.index("return ["), "python", budget, chars, **kw)


def test_imported_definitions_come_from_disk_as_a_comment_before_the_file(tmp_path):
    root = project(tmp_path)
    store = DocumentStore()
    doc = store.open((root / "pkg" / "main.py").as_uri(), MAIN, 1, "python")
    got = build(ExtraContext(), store, doc, root, 400)
    assert got.files == ("pkg/util.py",)
    lines = got.text.splitlines()
    assert lines[0] == "# file: pkg/util.py" and lines[-1] == "# file: pkg/main.py"
    assert all(line.startswith("#") for line in lines)
    # `slugify` comes through the package's re-export; the names the file uses come before the one it does not
    assert '# def slugify(text: str, sep: str = "-") -> str:' in lines
    assert '#     """Turn text into a URL slug."""' in lines
    assert lines.index("# class Table:") < lines.index("# def unused_helper(a, b):")
    assert "re.sub" not in got.text  # bodies are not shown
    assert got.tokens == chars(got.text) <= 400


def test_the_budget_bounds_the_block_and_drops_the_least_used_names_first(tmp_path):
    root = project(tmp_path)
    store = DocumentStore()
    doc = store.open((root / "pkg" / "main.py").as_uri(), MAIN, 1, "python")
    small = build(ExtraContext(), store, doc, root, 60)
    assert small.tokens <= 60 and "slugify" in small.text and "unused_helper" not in small.text
    assert build(ExtraContext(), store, doc, root, 5) == Extra()  # not even a file line fits


def test_an_open_document_is_read_before_the_disk_and_nothing_outside_the_workspace_is(tmp_path):
    root = project(tmp_path)
    store = DocumentStore()
    util_uri = (root / "pkg" / "util.py").as_uri()
    store.open(util_uri, UTIL.replace("def unused_helper(a, b)", "def unused_helper(a, b, c)"), 2, "python")
    doc = store.open((root / "pkg" / "main.py").as_uri(), MAIN, 1, "python")
    got = build(ExtraContext(), store, doc, root, 400, chunks=False)
    assert "def unused_helper(a, b, c):" in got.text  # the editor's unsaved text
    store.close(util_uri)
    outside = build(ExtraContext(), store, doc, root / "elsewhere", 400, chunks=False)
    assert outside == Extra()  # the project is not a workspace folder: nothing is read from disk


def test_other_files_chunks_fill_the_rest_of_the_budget_newest_first(tmp_path):
    root = project(tmp_path)
    store = DocumentStore()
    extra = ExtraContext()
    notes = store.open(
        (root / "notes.py").as_uri(), "".join(f"NOTE_{i} = {i}\n" for i in range(40)), 1, "python"
    )
    extra.opened(notes)
    doc = store.open((root / "pkg" / "main.py").as_uri(), MAIN, 1, "python")
    extra.opened(doc)  # the current file's own chunk is never placed
    got = build(extra, store, doc, root, 400)
    assert got.files == ("pkg/util.py", "notes.py")
    assert "# NOTE_0 = 0" in got.text and got.text.count("# file: pkg/main.py") == 1
    assert got.tokens <= 400
    assert build(extra, store, doc, root, 400, imports=False).files == ("notes.py",)
    assert build(extra, store, doc, root, 400, chunks=False).files == ("pkg/util.py",)


def test_a_chunk_is_trimmed_around_the_edit_to_fit():
    store = DocumentStore()
    extra = ExtraContext()
    other = store.open("file:///w/other.py", "".join(f"value_{i} = {i}\n" for i in range(100)), 1, "python")
    extra.ring.add(None)
    from lsprotocol import types

    edit = types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(50, 0), end=types.Position(50, 0)), text=""
    )
    extra.changed(other, [edit])
    doc = store.open("file:///w/main.py", "x = 1\n", 1, "python")
    got = extra.build(store.all(), [], doc, 0, "python", 40, chars)
    body = [line for line in got.text.splitlines() if line.startswith("# value_")]
    assert "# value_50 = 50" in body and 4 <= len(body) < 20  # the lines around the edit that fit
    assert got.tokens <= 40


def test_the_block_is_written_in_the_language_of_the_file():
    assert as_comment("file: a.ts\nexport function f(): number\n", "// ") == (
        "// file: a.ts\n// export function f(): number\n//\n"
    )
    store = DocumentStore()
    doc = store.open("file:///w/a.unknownext", "text\n", 1, "plaintext")
    assert ExtraContext().build(store.all(), [], doc, 0, None, 100, chars) == Extra()
    assert uri_path("untitled:Untitled-1") is None


def test_the_plan_reads_the_block_first_and_the_settings_turn_it_off():
    from dfim.engine.api import FillRequest
    from dfim.server.inline_plan import FillPlan

    def request(prefix: str) -> FillRequest:
        return FillRequest(prefix=prefix, suffix="\n")

    plan = FillPlan(request("x = "), "", None, (request("    "), None), request("x = "))
    got = with_extra(plan, Extra("# file: a.py\n", 5))
    assert got.request.prefix == "# file: a.py\nx = " and got.last_try[0].prefix == "# file: a.py\n    "
    assert got.again.prefix == "# file: a.py\nx = "
    assert with_extra(plan, Extra()) is plan
    merged, errors = merge_options(Options(), {"context": {"extra": {"enabled": False, "share": 0.1}}})
    assert not errors and merged.context.extra == ExtraContextOptions(enabled=False, share=0.1)
    _, errors = merge_options(Options(), {"context": {"extra": {"share": 0.9}}})
    assert errors and "share" in errors[0]


def test_the_names_used_nearest_the_cursor_get_in_first_and_are_written_in_import_order(tmp_path):
    (tmp_path / "lib.py").write_text(
        "def alpha(a):\n    return a\n\n\ndef beta(b):\n    return b\n\n\ndef gamma(c):\n    return c\n"
    )
    main = "from lib import alpha, beta, gamma\n\n\ndef one():\n    alpha(1)\n\n\ndef two():\n    gamma(2)\n    x = \n"
    store = DocumentStore()
    doc = store.open((tmp_path / "main.py").as_uri(), main, 1, "python")
    one_fits = ExtraContext().build(store.all(), [tmp_path], doc, main.index("x = ") + 4, "python", 12, chars)
    assert "def gamma(c):" in one_fits.text and "alpha" not in one_fits.text  # used on the line above
    all_fit = ExtraContext().build(store.all(), [tmp_path], doc, main.index("x = ") + 4, "python", 400, chars)
    text = all_fit.text
    assert text.index("def alpha") < text.index("def beta") < text.index("def gamma")  # import order
    # near the first function instead, alpha is the one chosen: the choice follows the cursor
    near_one = ExtraContext().build(store.all(), [tmp_path], doc, main.index("alpha(1)"), "python", 12, chars)
    assert "def alpha(a):" in near_one.text and "gamma" not in near_one.text


def test_an_opened_file_gives_the_ring_its_first_definitions_not_its_imports():
    from dfim.server.extra_context import first_code_line

    store = DocumentStore()
    text = '"""Doc."""\n\nimport os\nfrom x import (\n    a,\n)\n\nLIMIT = 1\n\n\ndef f():\n    pass\n'
    doc = store.open("file:///w/a.py", text, 1, "python")
    assert first_code_line(doc) == 7
    ts = store.open(
        "file:///w/a.ts", 'import {\n  a,\n} from "./x";\n// note\nexport const y = 1;\n', 1, "ts"
    )
    assert first_code_line(ts) == 4
    extra = ExtraContext()
    extra.opened(doc)
    (chunk,) = list(extra.ring)
    # a short file is one chunk; trimmed to a budget, it keeps the lines from its first definition on
    assert chunk.text.split("\n")[chunk.center] == "LIMIT = 1"
