"""The shipped tokenizer: exact round trips, fixed special ids, FIM layout, token bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfim.engine.model.tokenizer import NUM_SPECIAL, SPECIAL_TOKENS, Tokenizer, train

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small" / "tokenizer.json"

TRICKY = [
    "",
    "x",
    " ",
    "\n",
    "\r\n",
    "def f(a, b):\r\n\treturn a + b\r\n",
    "    if x:\n        return 1\n    return 2\n",
    "\t\t  mixed \t tabs\t\n",
    "emoji 😀👍🏽 and ünïcödé 中文 — “quotes”",
    "x = 12345678901234567890 + 0x1F_FF - 3.14e-10j",
    "s = '<fim_prefix>' + \"<eos>\" + '<pad>'  # looks special, is text",
    "trailing spaces   \n\n\n   ",
    "\x00\x01\x7f control chars \u200b zero width",
    "a" * 3000,
    "    " * 50 + "deep",
    "obj.attr_name.method_call()[0]['key']",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(TOKENIZER_JSON)


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_exact(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_round_trip_source_files(tok: Tokenizer) -> None:
    for path in sorted((Path(__file__).resolve().parents[3] / "engine").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert tok.decode(tok.encode(text)) == text, path


def test_special_ids_fixed(tok: Tokenizer) -> None:
    assert tok.vocab_size == 8192
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    assert (tok.fim_prefix_id, tok.fim_suffix_id, tok.fim_middle_id, tok.file_sep_id) == (4, 5, 6, 7)
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok._hf.token_to_id(name) == i
    assert SPECIAL_TOKENS[8:] == [f"<reserved_{k}>" for k in range(8)]


def test_special_strings_in_text_are_not_control_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<fim_prefix><eos><pad><file_sep>")
    assert all(i >= NUM_SPECIAL for i in ids)


def test_no_prefix_space(tok: Tokenizer) -> None:
    # A line's first word must not silently gain a space.
    assert tok.decode(tok.encode("return")) == "return"
    assert tok.decode(tok.encode("return")[:1]).startswith("r")


def test_code_friendly_splits(tok: Tokenizer) -> None:
    # Digits come in groups of at most three.
    for i in tok.encode("1234567890"):
        assert len(tok.token_bytes(i)) <= 3
    # Indentation runs are learned as single tokens.
    ids = tok.encode("\n        return x")
    assert any(tok.token_bytes(i).strip(b" ") == b"" and len(tok.token_bytes(i)) >= 4 for i in ids)
    # Common code compresses well (a bad vocabulary lands near 1-2 chars/token).
    code = "    def __init__(self, name: str) -> None:\n        self.name = name\n"
    assert len(code) / len(tok.encode(code)) > 3.0


def test_fim_context_layout(tok: Tokenizer) -> None:
    prefix, suffix = tok.encode("def f(x):\n    return "), tok.encode("\n\nprint(f(1))\n")
    ctx = tok.fim_context(prefix, suffix)
    expected = [tok.bos_id, tok.fim_suffix_id, *suffix, tok.fim_prefix_id, *prefix, tok.fim_middle_id]
    assert ctx == expected
    assert tok.fim_context([], []) == [2, 5, 4, 6]


def test_token_bytes(tok: Tokenizer) -> None:
    text = "héllo wörld 😀\r\n\tx"
    ids = tok.encode(text)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")
    for special in range(NUM_SPECIAL):
        assert tok.token_bytes(special) == b""
    # Every ordinary token has non-empty bytes (byte alphabet + merges).
    assert all(tok.token_bytes(i) for i in range(NUM_SPECIAL, tok.vocab_size))


def test_decode_drops_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("x = 1")
    assert tok.decode([*ids, tok.eos_id, tok.pad_id, tok.pad_id]) == "x = 1"


def test_train_small_vocab() -> None:
    texts = ["def add(a, b):\n    return a + b\n"] * 20 + ["class A:\n    pass\n"] * 20
    small = train(texts, vocab_size=300)
    assert small.vocab_size <= 300
    assert small.eos_id == 1 and small.fim_middle_id == 6
    for t in texts[:1] + TRICKY:
        assert small.decode(small.encode(t)) == t


# ----------------------------------------------------------------------------------------------
# The multilingual vocabulary: training from .py folders plus corpus shards

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
BASE_TOKENIZER_JSON = TOKENIZER_JSON.parents[1] / "dfim-base" / "tokenizer.json"


def write_shard(path: Path, rows: list[dict]) -> None:
    import json
    import lzma

    with lzma.open(path, "wb") as f:
        for row in rows:
            f.write((json.dumps(row) + "\n").encode())


def test_corpus_sample_is_balanced_and_filtered(tmp_path: Path) -> None:
    from dfim.engine.model.tokenizer import read_corpus_text

    go, rs = (FIXTURES / "example.go").read_text(), (FIXTURES / "example.rs").read_text()
    rows = [{"text": go, "path": f"g{i}.go", "lang": "go", "license": "MIT"} for i in range(50)]
    rows += [{"text": rs, "path": f"r{i}.rs", "lang": "rust", "license": "Apache-2.0"} for i in range(50)]
    rows += [{"text": "GPL_ONLY_MARKER = 1\n", "path": "x.c", "lang": "c", "license": "GPL-2.0"}]
    write_shard(tmp_path / "a.jsonl.xz", rows)
    budget = 10 * len(go.encode())
    sample = read_corpus_text([tmp_path / "a.jsonl.xz"], budget, languages=("go", "rust", "c"))
    assert set(sample) == {"go", "rust"}  # the only C record is GPL
    go_bytes = sum(len(t.encode()) for t in sample["go"])
    assert budget / 3 <= go_bytes < budget / 3 + len(go.encode())  # its share, then no more
    assert len(sample["rust"]) > len(sample["go"])  # shorter files: more of them in the same share


def test_build_main_mixes_python_and_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dfim.commands.tokenizer import main as build_main

    pyroot = tmp_path / "py"
    pyroot.mkdir()
    (pyroot / "example.py").write_text((FIXTURES / "example.py").read_text())
    rows = [
        {
            "text": (FIXTURES / f"example.{ext}").read_text(),
            "path": f"{i}.{ext}",
            "lang": lang,
            "license": "MIT",
        }
        for i in range(20)
        for ext, lang in (("go", "go"), ("rs", "rust"), ("js", "javascript"))
    ]
    write_shard(tmp_path / "train-00.jsonl.xz", rows)
    out = tmp_path / "tok" / "tokenizer.json"
    argv = [
        "--out",
        str(out),
        "--vocab-size",
        "600",
        "--max-mb",
        "0.05",
        "--corpus",
        str(tmp_path / "train-00.jsonl.xz"),
    ]
    assert build_main([str(pyroot), *argv]) == 0  # after --corpus, a root would be a shard
    printed = capsys.readouterr().out
    for lang in ("python", "go", "rust", "javascript"):
        assert f"  {lang}: " in printed
    tok = Tokenizer.from_file(out)
    assert tok.vocab_size <= 600
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok._hf.token_to_id(name) == i
    for ext in ("go", "rs", "js", "py"):
        text = (FIXTURES / f"example.{ext}").read_text()
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.skipif(not BASE_TOKENIZER_JSON.is_file(), reason="dfim-base tokenizer not trained yet")
def test_base_tokenizer_keeps_the_special_ids() -> None:
    base, small = Tokenizer.from_file(BASE_TOKENIZER_JSON), Tokenizer.from_file(TOKENIZER_JSON)
    assert base.vocab_size == 16384
    for name in SPECIAL_TOKENS:
        assert base._hf.token_to_id(name) == small._hf.token_to_id(name)
    assert base.fim_context([], []) == small.fim_context([], [])
    assert all(i >= NUM_SPECIAL for i in base.encode("<fim_prefix><eos><pad><file_sep>"))
    for text in TRICKY + [(FIXTURES / f"example.{ext}").read_text() for ext in ("go", "rs", "js", "py")]:
        assert base.decode(base.encode(text)) == text
    # Indentation and digits follow the same code-friendly split as the shipped vocabulary.
    assert all(len(base.token_bytes(i)) <= 3 for i in base.encode("1234567890"))
