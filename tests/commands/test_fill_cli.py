"""`dfim fill`: bad input is one line on stderr and exit 2; good input prints the middle (or JSON)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dfim.cli import main
from dfim.engine.model.checkpoint import write_random_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_JSON = ROOT / "engine" / "weights" / "dfim-small" / "tokenizer.json"
EXAMPLE = ROOT / "fixtures" / "example.py"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return str(write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), TOKENIZER_JSON, seed=4))


def dfim_fill(capsys, *args):
    code = main(["fill", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("dfim fill: ")
    for needle in needles:
        assert needle in lines[0]


def test_fill_prints_the_middle(capsys, checkpoint):
    code, out, err = dfim_fill(
        capsys,
        EXAMPLE,
        "--line",
        12,
        "--col",
        9,
        "--model",
        checkpoint,
        "--steps",
        2,
        "--seed",
        0,
        "--max-tokens",
        16,
    )
    assert code == 0 and out.endswith("\n") and len(out) > 1
    assert "untrained" in err and checkpoint in err  # a random checkpoint is announced, plainly


def test_fill_json_fields(capsys, checkpoint):
    code, out, _ = dfim_fill(
        capsys,
        EXAMPLE,
        "--line",
        19,
        "--col",
        12,
        "--model",
        checkpoint,
        "--steps",
        3,
        "--seed",
        1,
        "--max-tokens",
        16,
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert {"text", "steps", "tokens", "canvas_length", "latency_ms", "stop_reason"} <= set(data)
    assert data["steps"] == 3 and data["canvas_length"] == 16 and data["stop_reason"] == "max_steps"
    assert data["language"] == "python" and data["random_model"] is True
    assert isinstance(data["text"], str) and 1 <= data["tokens"] <= 16 and data["latency_ms"] > 0


def test_fill_is_reproducible_with_a_seed(capsys, checkpoint):
    args = (
        EXAMPLE,
        "--line",
        5,
        "--col",
        1,
        "--model",
        checkpoint,
        "--steps",
        2,
        "--seed",
        5,
        "--max-tokens",
        16,
    )
    assert dfim_fill(capsys, *args)[1] == dfim_fill(capsys, *args)[1]


def test_fill_json_echoes_the_seed_and_repeats_text_and_steps(capsys, checkpoint):
    """Issue 35: three identical runs took 8, 2 and 7 steps. The seed is 0 unless given (as the editor's
    fills), --json reports it, and the same seed gives the same text and the same steps."""
    base = (EXAMPLE, "--line", 12, "--col", 9, "--model", checkpoint, "--max-tokens", 16, "--json")
    runs = [json.loads(dfim_fill(capsys, *base)[1]) for _ in range(2)]
    assert runs[0]["seed"] == 0
    assert (runs[0]["text"], runs[0]["steps"]) == (runs[1]["text"], runs[1]["steps"])
    seeded = [json.loads(dfim_fill(capsys, *base, "--seed", 11)[1]) for _ in range(2)]
    assert seeded[0]["seed"] == 11
    assert (seeded[0]["text"], seeded[0]["steps"], seeded[0]["tokens"]) == (
        seeded[1]["text"],
        seeded[1]["steps"],
        seeded[1]["tokens"],
    )


def test_missing_file(capsys, tmp_path):
    code, _, err = dfim_fill(capsys, tmp_path / "nope.py", "--line", 1, "--col", 1)
    assert_one_line_error(code, err, "nope.py", "no such file")


def test_binary_files(capsys, tmp_path):
    nul = tmp_path / "blob.py"
    nul.write_bytes(b"x = 1\n\x00\x01\x02")
    assert_one_line_error(*dfim_fill(capsys, nul, "--line", 1, "--col", 1)[::2], "binary")
    latin = tmp_path / "latin.py"
    latin.write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    assert_one_line_error(*dfim_fill(capsys, latin, "--line", 1, "--col", 1)[::2], "not UTF-8", "byte 3")
    wide = tmp_path / "wide.py"
    wide.write_bytes("x = 1\n".encode("utf-16"))
    assert_one_line_error(*dfim_fill(capsys, wide, "--line", 1, "--col", 1)[::2], "UTF-16")


def test_an_empty_file_is_filled_and_a_directory_refused(capsys, tmp_path, checkpoint):
    empty = tmp_path / "empty.py"
    empty.write_text("")
    fast = ("--model", checkpoint, "--steps", 1, "--max-tokens", 16, "--json")
    code, out, err = dfim_fill(capsys, empty, "--line", 1, "--col", 1, *fast)  # as the server fills one
    assert code == 0 and json.loads(out)["language"] == "python", err
    assert_one_line_error(*dfim_fill(capsys, empty, "--line", 2, "--col", 1)[::2], "line 2", "out of range")
    assert_one_line_error(*dfim_fill(capsys, tmp_path, "--line", 1, "--col", 1)[::2], "directory")


@pytest.mark.parametrize(
    "line, col, needle",
    [(0, 1, "line 0"), (999, 1, "line 999"), (1, 0, "column 0"), (1, 500, "column 500"), (2, 2, "column 2")],
)
def test_position_out_of_range(capsys, line, col, needle):
    # line 2 of example.py is empty: only column 1 (its end) exists
    assert_one_line_error(
        *dfim_fill(capsys, EXAMPLE, "--line", line, "--col", col)[::2], needle, "out of range"
    )


def test_position_at_line_end_and_after_the_last_newline_is_fine():
    from dfim.commands.fill import split_at

    text = "ab\r\ncd\n"
    assert split_at(text, 1, 3) == ("ab", "\r\ncd\n")  # after the last character of a CRLF line
    assert split_at(text, 2, 2) == ("ab\r\nc", "d\n")
    assert split_at(text, 3, 1) == (text, "")  # the empty line after the final newline


def test_a_script_without_an_extension_takes_its_shebangs_language(capsys, tmp_path, checkpoint):
    script = tmp_path / "deploy"
    script.write_text("#!/usr/bin/env python3\nimport sys\n\nargs = \n")
    fast = ("--model", checkpoint, "--steps", 1, "--max-tokens", 16, "--json")
    code, out, err = dfim_fill(capsys, script, "--line", 4, "--col", 8, *fast)
    assert code == 0 and json.loads(out)["language"] == "python", err
    script.write_text("no shebang here\n")
    assert_one_line_error(
        *dfim_fill(capsys, script, "--line", 1, "--col", 1)[::2], "without an extension", "--language"
    )


def test_unknown_extension_needs_language(capsys, tmp_path, checkpoint):
    notes = tmp_path / "notes.xyz"
    notes.write_text("total = \n")
    assert_one_line_error(
        *dfim_fill(capsys, notes, "--line", 1, "--col", 9)[::2], "unknown file type", "--language"
    )
    code, out, _ = dfim_fill(
        capsys,
        notes,
        "--line",
        1,
        "--col",
        9,
        "--language",
        "python",
        "--model",
        checkpoint,
        "--steps",
        1,
        "--max-tokens",
        16,
        "--json",
    )
    assert code == 0 and json.loads(out)["language"] == "python"


def test_missing_and_corrupt_checkpoints(capsys, tmp_path, checkpoint):
    code, _, err = dfim_fill(capsys, EXAMPLE, "--line", 1, "--col", 1, "--model", tmp_path / "no-model")
    assert_one_line_error(code, err, "no-model", "not found")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in Path(checkpoint).iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    shard = next(broken.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])
    code, _, err = dfim_fill(capsys, EXAMPLE, "--line", 1, "--col", 1, "--model", broken)
    assert_one_line_error(code, err, shard.name)


def test_bad_numbers(capsys):
    assert_one_line_error(*dfim_fill(capsys, EXAMPLE, "--line", 1, "--col", 1, "--steps", 0)[::2], "--steps")
    assert_one_line_error(
        *dfim_fill(capsys, EXAMPLE, "--line", 1, "--col", 1, "--max-tokens", -3)[::2], "--max-tokens"
    )
    for seed in (2**64, -(2**63) - 1):  # past int64: torch's generator raised a traceback
        assert_one_line_error(
            *dfim_fill(capsys, EXAMPLE, "--line", 1, "--col", 1, "--seed", seed)[::2], "--seed"
        )


def test_model_that_is_a_file(capsys):
    code, _, err = dfim_fill(capsys, EXAMPLE, "--line", 1, "--col", 1, "--model", EXAMPLE)
    assert_one_line_error(code, err, "--model", "is a file, not a folder")  # was "folder not found"


@pytest.mark.parametrize("command", ["fill", "trace"])
def test_ctrl_c_during_a_fill_is_one_line_and_status_130(tmp_path, checkpoint, command):
    # 100000 steps of a random model (no early stop: it is never confident) run far longer than the test
    argv = [str(EXAMPLE), "--line", "1", "--col", "1", "--model", checkpoint, "--steps", "100000"]
    argv += ["--out", str(tmp_path / "t.html")] if command == "trace" else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "dfim", command, *argv],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a suite started in the background of a shell without job control inherits SIGINT ignored, and
        # Python then installs no KeyboardInterrupt handler: the child gets Ctrl-C's default back
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        note = proc.stderr.readline()  # printed once the model is loaded, just before the fill starts
        assert "untrained" in note, note
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip() == f"dfim {command}: interrupted"


def test_real_process_exit_status(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dfim", "fill", str(tmp_path / "gone.py"), "--line", "1", "--col", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"dfim fill: {tmp_path / 'gone.py'}: no such file"


def test_a_fill_is_one_line_unless_multiline(capsys, checkpoint):
    # fixtures/demo.py line 8 is `    return `: the README's spot, after code; line 9 is blank
    demo = ROOT / "fixtures" / "demo.py"
    for line, col in ((8, 12), (9, 1)):
        for seed in range(3):
            args = [demo, "--line", line, "--col", col, "--model", checkpoint, "--steps", 2, "--seed", seed]
            code, out, _ = dfim_fill(capsys, *args, "--json")
            result = json.loads(out)
            assert code == 0 and "\n" not in result["text"], result
            assert result["canvas_length"] == 32
    code, out, _ = dfim_fill(capsys, *args, "--multiline", "--json")
    assert code == 0 and json.loads(out)["canvas_length"] == 64
    # at the end of a line that opens a block the fill is the block's first line, on a new line, as the
    # server's (decision 49): the break and the indentation, then one line
    shown = 0
    for seed in range(4):
        code, out, _ = dfim_fill(
            capsys,
            demo,
            "--line",
            4,
            "--col",
            19,
            "--model",
            checkpoint,
            "--steps",
            2,
            "--seed",
            seed,
            "--json",
        )
        result = json.loads(out)
        assert code == 0 and result["canvas_length"] == 32
        if result["text"].strip():
            shown += 1
            assert result["text"].startswith("\n    ") and result["text"].count("\n") == 1, result
    assert shown


def test_block_lead_follows_the_line_that_opens_a_block():
    from dfim.engine.layout import block_lead, opens_block

    assert block_lead("def f(x):", "\n") == "\n    "
    assert block_lead("class A:\n    def f(self):", "") == "\n        "
    assert block_lead("\tif x > 0:", "\n\treturn 1") == "\n\t\t"
    assert block_lead("function f() {", "\n}") == "\n    "
    # the file's own step, and the language's habit before there is one
    assert block_lead("function f() {\n  if (x) {", "\n  }\n}\n") == "\n    "
    assert block_lead("func main() {", "\n}\n", "go") == "\n\t"
    # a signature or condition over several lines ends with its closing bracket
    assert block_lead("def f(\n    a,\n) -> int:", "\n") == "\n    "
    assert block_lead("if (\n    a\n    and b\n):", "\n") == "\n    "
    assert opens_block("public:") and opens_block("    elif y == 2:  ") and opens_block("case 1:")
    # the line goes on after a bracket or a colon that opens no block, and with code after the cursor
    for line in ("x = f(", "xs = [", 'd = {"a":', "y = x[1:", "let n:", "return x", "lambda x:"):
        assert block_lead(line, "\n") == "", line
    assert block_lead("if x:", " pass\n") == ""
    # a brace or colon in a string or a comment opens nothing
    for line in ('print(f"total: {', "const s = `a ${", "// returns {", "x = 1  # note:", "s = 'if x:"):
        assert not opens_block(line), line
    assert opens_block('if s == "a#b":') and opens_block("if (s == '}') {")
    # in the language's own comment and quote syntax: `//` is Python's floor division, `#` is code in
    # JavaScript and Rust, a Rust lifetime is no quote; a line that ends in a comment opens nothing (the
    # server goes on with the comment there too)
    assert opens_block("if n // 2:", "python") and opens_block("if (this.#n > 0) {", "javascript")
    assert opens_block("struct Parser<'a> {", "rust") and opens_block("'outer: for x in v {", "rust")
    assert opens_block("#[cfg(test)] mod tests {", "rust") and opens_block("case 'a':", "java")
    assert not opens_block("if x > 0:  # positive", "python") and not opens_block(
        "if (x) { // go", "javascript"
    )
    assert block_lead("x = 1\nif x > 0:  # positive", "\n") == ""
    # a colon inside brackets, or one a brace language gives to types, opens nothing
    for line, lang in (
        ("def greet(name:", "python"),
        ("for x in sorted(xs, key=lambda v:", "python"),
        ("  private name:", "typescript"),
        ("):", "typescript"),
        ("for (auto& x :", "cpp"),
    ):
        assert not opens_block(line, lang), line
    assert opens_block("public:", "cpp") and not opens_block("public:", "java")
    # the block is indented from the statement's first line
    assert block_lead("  if (a &&\n      b) {", "\n  }", "javascript") == "\n    "
    # an opening line too far up to look for: the last line's own indentation
    long_body = "    if (ok) {\n" + "        step();\n" * 60 + "    } else {"
    assert block_lead(long_body, "\n", "javascript") == "\n" + " " * 8
    assert (
        block_lead("/**\n * Doc\n */\nfunction f() {\n  const a = 1;\n  if (a) {", "\n", "javascript")
        == "\n    "
    )


def test_a_crlf_file_fills_without_a_stray_carriage_return(capsys, tmp_path, checkpoint):
    import argparse

    from dfim.commands.fill import add_fill_arguments, read_fill_input

    path = tmp_path / "crlf.py"
    path.write_bytes(b"def add(a, b):\r\n    total = a + b\r\n    return total +\r\n\r\nprint(add(1, 2))\r\n")
    parser = argparse.ArgumentParser()
    add_fill_arguments(parser)
    prefix, suffix, _ = read_fill_input(parser.parse_args([str(path), "--line", "3", "--col", "19"]))
    # the model reads (and so writes) plain newlines: no "\r" left to end up before a stop
    assert prefix.endswith("    return total +") and suffix == "\n\nprint(add(1, 2))\n"
    code, out, _ = dfim_fill(capsys, path, "--line", 3, "--col", 19, "--model", checkpoint, "--seed", 0,
                             "--steps", 2, "--max-tokens", 16, "--json")  # fmt: skip
    assert code == 0 and "\r" not in json.loads(out)["text"]


def test_the_windows_fit_the_context_the_model_was_trained_with():
    from dfim.cursor_fill import fit_to_model
    from dfim.engine.inference.fill import Engine

    engine = Engine.load(None)  # the shipped model: its dfim.json says how many context tokens it read
    n = engine.trained_context
    assert n == 1024
    lines = [f"value_{i} = compute({i}, scale={i * 3})\n" for i in range(400)]
    prefix, suffix = "".join(lines[:300]), "".join(lines[300:])
    fitted_prefix, fitted_suffix = fit_to_model(prefix, suffix, engine)
    p, s = (len(engine.tokenizer.encode(t)) for t in (fitted_prefix, fitted_suffix))
    assert s <= (n - 4) // 3 and p + s <= n - 4
    assert p > 250  # the prefix takes what the suffix leaves
    # the near ends are kept, cut at whole lines
    assert prefix.endswith(fitted_prefix) and fitted_prefix.startswith("value_")
    assert suffix.startswith(fitted_suffix) and fitted_suffix.endswith("\n")
    assert fit_to_model("x = 1\n", "y = 2\n", engine) == ("x = 1\n", "y = 2\n")


def test_fill_with_candidates_answers_the_engines_best_and_refuses_bad_counts(capsys, checkpoint):
    from dfim.engine import Engine, FillRequest, SamplerSettings

    args = (EXAMPLE, "--line", 5, "--col", 1, "--model", checkpoint, "--steps", 2, "--seed", 3)
    code, out, _ = dfim_fill(capsys, *args, "--candidates", 3, "--json")
    assert code == 0
    # the same request to the engine: the printed text is its best-ranked candidate, not row 0 alone
    engine = Engine.load(checkpoint)
    lines = EXAMPLE.read_text().split("\n")
    head = "\n".join(lines[:4]) + "\n"
    alone = engine.fill(
        FillRequest(
            prefix=head,
            suffix=EXAMPLE.read_text()[len(head) :],
            max_tokens=32,
            seed=3,
            settings=SamplerSettings(max_steps=2),
            stop=("\n",),
            candidates=3,
        )
    )
    assert json.loads(out)["text"] in [alone.text, *alone.alternatives]
    for bad in (0, 17):
        code, _, err = dfim_fill(capsys, *args, "--candidates", bad)
        assert_one_line_error(code, err, "--candidates")


@pytest.mark.parametrize(
    ("col", "model_text"),
    [(5, "return size"), (8, "urn size")],  # before `return size`; inside it, `ret▮urn size`
)
def test_a_fill_mid_line_never_repeats_the_rest_of_the_line(capsys, checkpoint, monkeypatch, col, model_text):
    """Issue 35: `dfim fill` in the middle of a line printed the rest of the line again (`ret` before
    `ret`), where the server cuts it. It now goes through the server's inline post-processing."""
    from dfim.engine.api import FillResult
    from dfim.engine.inference.fill import Engine

    def fake_fill(self, request):
        return FillResult(model_text, 1, 16, 3, 10, 10, 1.0, "stable")

    monkeypatch.setattr(Engine, "fill", fake_fill)
    args = (EXAMPLE, "--line", 14, "--col", col, "--model", checkpoint)
    code, out, err = dfim_fill(capsys, *args)
    assert code == 0 and out.strip() == "" and "repeated the rest of the line" in err
    data = json.loads(dfim_fill(capsys, *args, "--json")[1])
    assert data["text"] == "" and data["raw_text"] == model_text and data["alternatives"] == []
    # at the end of a line nothing is cut: the fill is the model's
    code, out, _ = dfim_fill(capsys, EXAMPLE, "--line", 14, "--col", 16, "--model", checkpoint)
    assert code == 0 and out == model_text + "\n"


def test_a_multiline_fill_shows_its_steps_and_quiet_hides_them(capsys, checkpoint):
    demo = ROOT / "fixtures" / "demo.py"
    args = [demo, "--line", 9, "--col", 1, "--model", checkpoint, "--steps", 3, "--multiline"]
    code, out, err = dfim_fill(capsys, *args)  # stderr is not a terminal here: plain lines
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("dfim fill: canvas 1: ")]
    assert lines and lines[-1].startswith("dfim fill: canvas 1: 3/3 steps (100%)"), err
    assert len(lines) == len(set(lines))
    quiet_code, quiet_out, quiet_err = dfim_fill(capsys, *args, "--quiet")
    assert quiet_code == 0 and quiet_out == out and "canvas 1" not in quiet_err  # same fill, no progress
    code, _, err = dfim_fill(capsys, *args[:-1])  # one line: too quick to need progress
    assert code == 0 and "canvas 1" not in err


def test_an_empty_fill_says_why():
    from dfim.commands.fill import empty_fill_reason

    assert empty_fill_reason("  ", "x)\n") == "wrote nothing here"
    assert empty_fill_reason("urn size", "urn size\nnext") == "only repeated the rest of the line"
    assert "--json has its raw text" in empty_fill_reason("a, 2, 1) => 3", ");\n")


def test_the_json_output_lists_the_other_candidates(capsys, checkpoint, monkeypatch):
    from dfim.engine.api import FillResult
    from dfim.engine.inference.fill import Engine

    def fake_fill(self, request):
        return FillResult("a", 1, 16, 1, 10, 10, 1.0, "stable", alternatives=["b", "c"])

    monkeypatch.setattr(Engine, "fill", fake_fill)
    out = dfim_fill(capsys, EXAMPLE, "--line", 14, "--col", 16, "--model", checkpoint, "--json")[1]
    assert json.loads(out)["alternatives"] == ["b", "c"]
