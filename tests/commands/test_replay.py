"""`dfim replay`: the judging rules, regions from files and git commits, and a run against the real server."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from dfim.bench import replay
from dfim.commands import replay as replay_command

TOKENIZER = Path(__file__).resolve().parents[2] / "engine" / "weights" / "dfim-small" / "tokenizer.json"


def test_judge_full_partial_rejected():
    doc, cursor = "x = \n", 4
    # the whole suggestion is what comes next
    assert replay.judge(doc, cursor, 4, 4, "foo(1)", "foo(1)\n", 3) == ("full", 6)
    # it also rewrites the rest of the line, unchanged: still a full accept of the new part
    assert replay.judge("f(\n", 2, 2, 2, "a)", "a)", 3) == ("full", 2)
    assert replay.judge("f()\n", 2, 2, 3, "a)", "a", 3) == ("full", 1)
    # a common prefix long enough is a partial accept counted by characters
    assert replay.judge(doc, cursor, 4, 4, "foo(2)", "foo(1)\n", 3) == ("partial", 4)
    # indentation alone is chance agreement however long; the whitespace before code is counted with it
    assert replay.judge(doc, cursor, 4, 4, "\n        x = 1", "\n        return y\n", 3) == ("rejected", 0)
    assert replay.judge(doc, cursor, 4, 4, "\n        retry()", "\n        return y\n", 3) == ("partial", 12)
    assert replay.judge(doc, cursor, 4, 4, "fox", "foo(1)\n", 3) == ("rejected", 0)
    # an item starting before the cursor must repeat what was typed
    assert replay.judge(doc, cursor, 2, 4, "= foo", "foo\n", 3) == ("full", 3)
    assert replay.judge(doc, cursor, 2, 4, "+ foo", "foo\n", 3) == ("rejected", 0)


def test_trigger_points():
    text = "def f(a):\n    return a\n"
    assert replay.trigger_points(text, "line") == [0, 14]
    assert replay.trigger_points(text, "chars", 10) == [0, 10, 20]
    word = replay.trigger_points(text, "word")
    assert word[:4] == [0, 4, 6, 8] and 11 not in word and 14 in word  # not inside indentation


def test_utf16_positions_round_trip():
    text = "s = '😋'\nx = 1\n"
    for offset in range(len(text) + 1):
        line, character = replay.utf16_position(text, offset)
        assert replay.utf16_offset(text, line, character) == offset
    assert replay.utf16_position(text, 7) == (0, 8)  # the emoji is two UTF-16 units


def test_regions_from_added_lines():
    text = "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n"
    regions = replay.regions_from_lines("c", "m.py", text, [1, 3, 4], 2000)
    assert [r.typed for r in regions] == ["b = 2\n", "d = 4\ne = 5\n"]
    first, second = regions
    assert (first.before, first.after) == ("a = 1\n", "c = 3\n")  # the later run is not there yet
    assert (second.before, second.after) == ("a = 1\nb = 2\nc = 3\n", "")
    diff = "+++ b/m.py\n@@ -1,0 +2 @@\n+b = 2\n@@ -3,0 +4,2 @@\n+d\n+e\n+++ /dev/null\n@@ -1 +0,0 @@\n"
    assert replay.added_lines(diff) == {"m.py": [1, 3, 4]}


def test_git_regions(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "m.py").write_text("def f():\n    return 1\n")
    (tmp_path / "notes.txt").write_text("hello\n")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    (tmp_path / "m.py").write_text("def f():\n    x = 2\n    return x\n")
    git("commit", "-q", "-am", "two")
    (last,) = replay.git_regions(str(tmp_path), 1, "HEAD", 2000)
    assert (last.before, last.typed, last.after) == ("def f():\n", "    x = 2\n    return x\n", "")
    both = replay.git_regions(str(tmp_path), 2, "HEAD", 2000)
    assert len(both) == 2 and all(r.path == "m.py" for r in both)  # notes.txt: no known language


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from dfim.engine.model.checkpoint import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), TOKENIZER)


def test_replay_against_the_real_server(checkpoint, tmp_path, monkeypatch):
    source = tmp_path / "tiny.py"
    source.write_text("a = 1\nb = a\n")
    parser = argparse.ArgumentParser()
    replay_command.add_arguments(parser)
    out = tmp_path / "out"
    # --model relative to the user's cwd, as the docs write it: the server runs elsewhere (the repository
    # root) and once answered "checkpoint folder not found" for a folder that was there.
    monkeypatch.chdir(checkpoint.parent)
    args = parser.parse_args(
        [str(source), "--model", checkpoint.name, "--trigger", "line", "--steps", "1", "--max-canvas", "16"]
        + ["--out", str(out), "--quiet", "--settings", '{"inline": {"multiline": true}}']
    )
    assert replay_command.run(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert "dfim replay" in (out / "summary.md").read_text()
    # the seed the server sampled with and the environment, recorded (issue 35)
    assert report["meta"]["seed"] == 0 and report["meta"]["environment"]["device"] == "cpu"
    assert {"dfim", "commit", "torch", "threads", "cpu"} <= set(report["meta"]["environment"])
    s, (region,) = report["summary"], report["regions"]
    assert report["server"]["is_random"] is True
    assert report["server"]["settings"]["inline"]["multiline"] is True  # --settings reached the server
    assert s["regions"] == 1 and s["chars"] == region["chars"] == len(source.read_text())
    # requests: on opening, at each line's start reached by typing, and after each accept
    assert region["requests"] >= 2 and s["requests"] == region["requests"] == len(region["latencies_ms"])
    assert (
        s["shown"] <= s["requests"]
        and s["accepted"] == s["full_accepts"] + s["partial_accepts"] <= s["shown"]
    )
    assert 0 <= s["accepted_chars"] <= s["chars"]
    # one model latency per request that ran the model; the server may ask twice (inline.retries = 1)
    assert len(region["model_latencies_ms"]) <= s["model_fills"] <= 2 * (s["requests"] + s["errors"])
    assert len(region["model_latencies_ms"]) <= s["requests"] + s["errors"]
    assert s["model_fills"] >= 1 and s["model_ms_total"] > 0
    counters = report["server"]["counters"]
    assert counters["completed"] == s["model_fills"]
    if s["shown"]:
        assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["shown"])
    assert s["chars_saved"] == pytest.approx(s["accepted_chars"] / s["chars"])
    if s["accepted"]:
        assert s["latency_per_accepted_ms"] == pytest.approx(s["model_ms_total"] / s["accepted"], rel=1e-3)
    else:
        assert s["latency_per_accepted_ms"] is None
    assert s["latency_p50_ms"] <= s["latency_p95_ms"]
    # every request is in the log, in order, with what it showed and what came of it
    log = region["request_log"]
    assert len(log) == s["requests"] and [r["ms"] for r in log] == region["latencies_ms"]
    assert [r["offset"] for r in log] == sorted(r["offset"] for r in log)
    assert sum(r["verdict"] != "none" for r in log) == s["shown"]
    assert sum(r["verdict"] in ("full", "partial") for r in log) == s["accepted"]
    assert sum(r["accepted_chars"] for r in log) == s["accepted_chars"]
    assert all(bool(r["shown"]) == (r["verdict"] != "none") for r in log)
    assert [r["model_ms"] for r in log if r["model_ms"] is not None] == region["model_latencies_ms"]
    assert sum(r["fills"] for r in log) == s["model_fills"]
    assert all((r["fills"] > 0) == (r["model_ms"] is not None) for r in log)
    # the encoder ran the context of the first fill; requests answered without the model encoded nothing
    assert log[0]["encoded_tokens"] > 0 and all(r["encoded_tokens"] >= 0 for r in log)
    assert all(r["encoded_tokens"] == 0 for r in log if r["fills"] == 0)
    # the gate: off in the server, so every suggestion shown was scored, and both rows come from this run
    gate = report["gate"]
    assert gate["live"] is False and gate["hidden"] == 0 and not any(r["gated"] for r in log)
    assert all(r["gate_score"] is not None and r["confidence"]["tokens"] >= 1 for r in log if r["shown"])
    without, gated = gate["without"], gate["with"]
    assert (without["shown"], without["accepted"]) == (s["shown"], s["accepted"])
    assert without["chars_saved"] == pytest.approx(s["chars_saved"])
    assert without["reward"] == pytest.approx(0.75 * s["accepted"] - 0.25 * (s["shown"] - s["accepted"]))
    passing = [r for r in log if r["shown"] and r["gate_score"] >= gate["threshold"]]
    assert gated["shown"] == len(passing) <= without["shown"]
    assert "| gate | shown |" in (out / "summary.md").read_text()
    text = source.read_text()
    for r in log:  # the cursor's position in the document the request saw (typed from empty: its line)
        assert replay.utf16_position(text, r["offset"]) == (r["line"], r["character"])


def test_the_summary_table_has_a_legend():
    """issue 35: "model ms / accepted" and the other columns are explained under the table."""
    summary = dict.fromkeys(
        ["regions", "chars", "requests", "shown", "accepted", "full_accepts", "partial_accepts"], 4
    )
    summary.update(acceptance_rate=0.5, chars_saved=0.25, model_fills=4, model_ms_total=80.0, errors=0)
    summary.update(latency_p50_ms=10.0, latency_p95_ms=20.0, model_latency_p50_ms=9.0)
    summary["latency_per_accepted_ms"] = 20.0
    report = {
        "summary": summary,
        "meta": {"command": "dfim replay x.py"},
        "server": {"model": "m", "is_random": False},
        "options": {"trigger": "line", "min_partial": 3},
    }
    text = replay.markdown(report)
    table_end = text.index("| 4 | 4 |")
    legend = text[table_end:].split("\n")[2]
    assert "model ms / accepted: all model time over the accepted completions" in legend
    assert "acceptance: accepted / shown" in legend and "(n = 4)" in legend
