"""dfim.bench.realcode.scoring: the fixture project's own tests pass the canonical middle and fail wrong ones."""

from __future__ import annotations

import io
from pathlib import Path

from dfim.bench.realcode.problems import load_jsonl
from dfim.bench.realcode.scoring import score

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "realcode"
PROJECT = FIXTURE / "project"


def by_id(problems):
    return {p["task_id"]: p for p in problems}


def test_canonical_passes_and_wrong_fails():
    problems = by_id(load_jsonl(FIXTURE / "problems.jsonl"))
    line = problems["textkit/intervals.py:16:1:line"]
    cond = problems["textkit/stats.py:16:8:condition"]
    assert line["canonical_solution"] == "    return merged\n"
    log = io.StringIO()
    records = score(
        [line, line, cond],
        [line["canonical_solution"], "    return merged[:1]\n", "n % 2 == 0"],
        problems_file=FIXTURE / "problems.jsonl",
        progress=log,
    )
    assert [r["passed"] for r in records] == [True, False, False]
    lines = log.getvalue().splitlines()  # issue 35: the suites show progress as they end, one line a count
    assert lines[0].startswith("testing: 0/3") and lines[-1].startswith("testing: 3/3 problems (100%)")
    assert len(lines) == len(set(lines)) == 4 and "pass 33.3%" in lines[-1]
    assert records[0]["exact_match"] and not records[1]["exact_match"]
    assert "FAILED" in records[1]["stderr"] or "Error" in records[1]["stderr"]
    assert (PROJECT / "textkit" / "intervals.py").read_text().count(
        "return merged\n"
    ) == 1  # copy, not original
