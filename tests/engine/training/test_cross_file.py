"""Cross-file training examples: definitions found in the served languages, projects read from the data
build's manifest, and blocks written exactly as the server writes them, inside the context budget."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dfim.engine.inference.extra_block import render_block
from dfim.engine.model.tokenizer import Tokenizer
from dfim.engine.training.cross_file import ProjectFiles, definitions, fit, names_used, project_and_path
from dfim.engine.training.data import build
from dfim.engine.training.examples import ExampleSettings, FimExamples
from dfim.engine.training.provenance import Root
from dfim.engine.training.shards import TokenShards

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-base" / "tokenizer.json"


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("def scale_vector(v, k):\n    return v\n", "scale_vector"),
        ("    async def fetch_page(self, url):\n", "fetch_page"),
        ("class Matrix(Base):\n", "Matrix"),
        ("func (m *Matrix) Transpose() *Matrix {\n", "Transpose"),
        ("pub(crate) fn parse_header(buf: &[u8]) -> Header {\n", "parse_header"),
        ("export function renderRow(row: Row): string {\n", "renderRow"),
        ("export const makeStore = (init) => {\n", "makeStore"),
        ("    public static int countWords(String text) {\n", "countWords"),
        ("static size_t buffer_grow(struct buffer *b, size_t n)\n", "buffer_grow"),
        ("int lua_resume(lua_State *L, int nargs);\n", "lua_resume"),
    ],
)
def test_definitions_in_every_served_language(source: str, name: str) -> None:
    assert name in definitions(source)


@pytest.mark.parametrize(
    "source",
    ["    total = scale_vector(v, 2)\n", "    return scale_vector(v, 2);\n", "scale_vector(v, 2);\n"],
)
def test_calls_are_not_definitions(source: str) -> None:
    assert "scale_vector" not in definitions(source)


def test_names_used_skip_keywords_and_short_names() -> None:
    assert names_used("return self.scale_vector(v, k) if ok else None") == ["scale_vector"]


def test_projects_and_shown_paths() -> None:
    assert project_and_path("corpus:mruby/src/complex.c") == ("corpus:mruby", "src/complex.c")
    assert project_and_path("site-packages:geom/linalg.py") == ("site-packages:geom", "geom/linalg.py")
    assert project_and_path("stdlib:json/decoder.py") == ("stdlib:json", "json/decoder.py")
    assert project_and_path("stdlib:abc.py") == ("stdlib:abc.py", "abc.py")


def test_fit_keeps_whole_lines_within_the_budget() -> None:
    pieces = [
        ("a.py", "def f(x):\n    return x\n\n\ndef g(y):\n    return y"),
        ("b.py", "def h():\n    pass"),
    ]
    count = len  # one token a character: easy to check by hand
    whole = render_block(pieces, "c.py", "# ")
    assert fit(pieces, "c.py", "# ", len(whole), count) == whole
    cut = fit(pieces, "c.py", "# ", len(whole) - 1, count)
    assert cut == render_block([pieces[0], ("b.py", "def h():")], "c.py", "# ")
    assert fit(pieces, "c.py", "# ", 10, count) == ""


LINALG = (
    "def scale_vector(vector, factor):\n"
    '    """Every element of vector times factor."""\n'
    "    return [x * factor for x in vector]\n\n\n"
    "def dot_product(a, b):\n"
    "    return sum(x * y for x, y in zip(a, b))\n"
)
SHAPES = "".join(
    f"def area_{i}(points):\n    scaled = scale_vector(points, {i})\n    return dot_product(scaled, points)\n\n\n"
    for i in range(40)
)


@pytest.fixture(scope="module")
def project_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cross")
    site = tmp / "site-packages"
    for rel, text in {
        "geom/linalg.py": LINALG,
        "geom/shapes.py": SHAPES,
        "geom/io.py": "import json\n\n\ndef load_points(path):\n    with open(path) as f:\n        return json.load(f)\n",
        "lonely.py": "def lonely_function(a):\n    return a + 1\n",
    }.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    out = tmp / "out"
    build(
        out, TOKENIZER_JSON, [Root(site, "site-packages")], workers=1, val_fraction=0.0, log=lambda *_: None
    )
    return out


def test_project_files_from_the_manifest(project_data: Path) -> None:
    shards = TokenShards(project_data, "train")
    projects = ProjectFiles.load(project_data, "train", len(shards))
    assert projects is not None
    by_path = {p: i for i, p in enumerate(projects.paths)}
    others = projects.others(by_path["geom/shapes.py"])
    assert sorted(projects.paths[i] for i in others) == ["geom/io.py", "geom/linalg.py"]
    assert projects.others(by_path["lonely.py"]) is None
    assert ProjectFiles.load(project_data, "train", len(shards) + 1) is None  # a manifest of other shards


def test_examples_carry_the_server_block_within_the_budget(project_data: Path) -> None:
    tok = Tokenizer.from_file(TOKENIZER_JSON)
    settings = ExampleSettings(context_tokens=256, cross_file_p=1.0, short_context_p=0.0)
    shards = TokenShards(project_data, "train")
    projects = ProjectFiles.load(project_data, "train", len(shards))
    examples = FimExamples(shards, tok, settings, random.Random(0), projects)
    with_block = 0
    copied = 0
    for _ in range(300):
        ex = examples.example(63)
        assert len(ex.context) <= settings.context_tokens
        if not ex.kind.endswith("+files"):
            continue
        with_block += 1
        context = tok.decode(ex.context)
        block = context[context.index("# file: ") :]
        own = next(p for p in ("geom/shapes.py", "geom/linalg.py", "geom/io.py") if f"# file: {p}\n" in block)
        # The block ends with the example's own file line; no other piece is from that file.
        head, _, _ = block.partition(f"# file: {own}\n")
        assert f"# file: {own}" not in head
        middle = tok.decode([t for t in ex.canvas[: ex.middle_len]])
        if (
            own == "geom/shapes.py"
            and "scale_vector(" in middle
            and "def scale_vector(vector, factor):" in head
        ):
            copied += 1
    assert with_block > 100
    assert copied > 0  # the definition of a name the middle calls was in the block
