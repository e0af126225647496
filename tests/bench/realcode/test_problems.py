"""dfim.bench.realcode.problems: the builder on fixtures/realcode/project (a stdlib package with a unittest
suite), and the shipped problems file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dfim.bench.realcode.problems import build, is_test_file, load_jsonl, project_dir, wrong_middle
from dfim.bench.realcode.scoring import score
from dfim.bench.realcode.spans import KINDS
from dfim.bench.realcode.tracing import DEFAULT_TEST_COMMAND, RealcodeError

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "realcode"
PROJECT = FIXTURE / "project"


@pytest.fixture(scope="module")
def built():
    problems, info = build(PROJECT, project_field="project")
    return problems, info


def by_id(problems):
    return {p["task_id"]: p for p in problems}


def test_build_keeps_only_exercised_spans(built):
    problems, info = built
    kinds = {p["kind"] for p in problems}
    assert kinds == set(KINDS)
    ids = by_id(problems)
    # functions no test calls, and a branch no test takes, give no problems
    assert not any(p["entry_point"] in ("geometric_mean", "Inventory.report") for p in problems)
    assert "textkit/stats.py:23:9:line" not in ids  # raise in clamp: no test passes low > high
    assert info["counts"]["candidates_line"] > info["counts"]["exercised_line"]
    for p in problems:
        assert p["prompt"] + p["canonical_solution"] + p["suffix"] == (PROJECT / p["path"]).read_text()
        assert p["project"] == "project" and p["test_command"] == DEFAULT_TEST_COMMAND
        assert not is_test_file(Path(p["path"]))
    assert len(ids) == len(problems)


def test_shipped_problems_match_the_builder(built):
    shipped = load_jsonl(FIXTURE / "problems.jsonl")
    fresh = by_id(built[0])
    assert shipped and {p["task_id"] for p in shipped} <= set(fresh)  # mutation check only drops spans
    for p in shipped:
        assert p == fresh[p["task_id"]]
        assert project_dir(p, FIXTURE / "problems.jsonl") == PROJECT


def test_a_span_the_tests_ignore_passes_when_broken(built):
    # why --mutation-check exists: clamp's `low > high` guard runs, but no test checks what it guards
    problem = {**by_id(built[0])["textkit/stats.py:22:8:condition"], "project": str(PROJECT)}
    (record,) = score([problem], [wrong_middle(problem)])
    assert wrong_middle(problem) == "False" and record["passed"] is True
    shipped = {p["task_id"] for p in load_jsonl(FIXTURE / "problems.jsonl")}
    assert problem["task_id"] not in shipped


def test_failing_suite_is_refused(tmp_path):
    project = shutil.copytree(PROJECT, tmp_path / "p")
    path = project / "textkit" / "stats.py"
    path.write_text(path.read_text().replace("return (ordered[middle - 1]", "return (ordered[middle]"))
    with pytest.raises(RealcodeError, match="do not pass"):
        build(project)
