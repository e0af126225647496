"""dfim.bench.realcode.scoring.model_completions and `dfim bench-realcode score --model`: the model reads the
windows the editor and `dfim fill` give it, and each filled problem is written out as it comes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dfim.bench.realcode.scoring import model_completions
from dfim.cli import main
from dfim.engine.model.checkpoint import write_random_checkpoint

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER_JSON = ROOT / "engine" / "weights" / "dfim-small" / "tokenizer.json"
PROBLEMS = ROOT / "fixtures" / "realcode" / "problems.jsonl"
TRAINED = 128


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random tiny checkpoint that says it was trained on TRAINED context tokens."""
    folder = write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), TOKENIZER_JSON, seed=4)
    info_file = folder / "dfim.json"
    info = json.loads(info_file.read_text())
    info["context_tokens"] = TRAINED
    info_file.write_text(json.dumps(info))
    return str(folder)


def test_a_long_file_is_cut_to_the_models_window(checkpoint, monkeypatch):
    from dfim.cursor_fill import fit_to_model, window
    from dfim.engine.inference.fill import Engine

    seen = []
    real_fill = Engine.fill

    def spy(self, request, *args, **kwargs):
        seen.append((self, request))
        return real_fill(self, request, *args, **kwargs)

    monkeypatch.setattr(Engine, "fill", spy)
    lines = [f"value_{i} = compute({i}, scale={i * 3})\n" for i in range(400)]
    problem = {"task_id": "long.py:301:1:line", "kind": "line", "prompt": "".join(lines[:300])}
    problem["suffix"] = "".join(lines[301:])
    stream = io.StringIO()
    completions, info, _ = model_completions([problem], checkpoint, "cpu", 8, 0, stream=stream)
    ((engine, request),) = seen
    assert engine.trained_context == TRAINED
    count = lambda text: len(engine.tokenizer.encode(text))  # noqa: E731
    assert count(request.prefix) + count(request.suffix) <= TRAINED
    # the near ends, cut at whole lines: what `dfim fill` sends for the same hole
    assert problem["prompt"].endswith(request.prefix) and problem["suffix"].startswith(request.suffix)
    assert (request.prefix, request.suffix) == fit_to_model(
        *window(problem["prompt"], problem["suffix"]), engine
    )
    assert info[0]["context_tokens"] <= TRAINED
    row = json.loads(stream.getvalue())
    assert row["task_id"] == problem["task_id"] and row["completion"] == completions[0]


def test_score_streams_one_line_per_filled_problem(checkpoint, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["bench-realcode", "score", str(PROBLEMS), "--model", checkpoint, "--limit", "2",
                 "--max-tokens", "8", "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    problems = [json.loads(line) for line in PROBLEMS.read_text().splitlines()[:2]]
    assert [r["task_id"] for r in rows] == [p["task_id"] for p in problems]
    results = json.loads((out / "results.json").read_text())["problems"]
    assert [r["completion"] for r in rows] == [r["completion"] for r in results]
    assert "completions.jsonl" in capsys.readouterr().out
    # the suites' results stream too, one line as each ends, and agree with the final file
    tested = [json.loads(line) for line in (out / "tests.jsonl").read_text().splitlines()]
    by_id = {r["task_id"]: r for r in results}
    assert sorted(r["task_id"] for r in tested) == sorted(by_id)
    assert all(r["passed"] == by_id[r["task_id"]]["passed"] for r in tested)


def test_a_block_problem_is_filled_as_the_editor_fills_a_selection(checkpoint, monkeypatch):
    """A block is a multiline fill without the draft (the editor's rewrite), a line one line with the
    server's candidates, through the same `dfim.cursor_fill` as `dfim fill`."""
    from dfim.engine.inference.fill import Engine

    seen = []
    real_fill = Engine.fill
    monkeypatch.setattr(
        Engine, "fill", lambda self, request: seen.append(request) or real_fill(self, request)
    )
    block = {
        "task_id": "m.py:3:1:block",
        "kind": "block",
        "path": "m.py",
        "prompt": "def f(x):\n",
        "suffix": "\n",
    }
    line = {**block, "task_id": "m.py:3:1:line", "kind": "line"}
    model_completions([block, line], checkpoint, "cpu", 8, 0)
    multi, single = seen
    assert multi.stop == () and not multi.settings.draft and multi.max_tokens == 32
    assert single.stop == ("\n",) and single.max_tokens == 8
