"""The real-code benchmark builder on fixtures/realcode/project (a stdlib package with a unittest suite)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dfim.bench import realcode

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "realcode"
PROJECT = FIXTURE / "project"


@pytest.fixture(scope="module")
def built():
    problems, info = realcode.build(PROJECT, project_field="project")
    return problems, info


def by_id(problems):
    return {p["task_id"]: p for p in problems}


def test_spans_of_every_kind_with_exact_text():
    text = (PROJECT / "textkit" / "stats.py").read_text()
    data = text.encode()
    spans = realcode.find_spans(text)
    texts = {(s.kind, data[s.start : s.end].decode()) for s in spans}
    assert ("line", "    middle = n // 2\n") in texts
    assert ("condition", "n % 2 == 1") in texts
    assert ("call", "max(low, min(value, high))") in texts
    assert any(k == "block" and t.startswith("    ordered = sorted(values)\n") for k, t in texts)
    assert not any("Small statistics" in t for _, t in texts)  # module docstring: not inside a function


def test_build_keeps_only_exercised_spans(built):
    problems, info = built
    kinds = {p["kind"] for p in problems}
    assert kinds == set(realcode.KINDS)
    ids = by_id(problems)
    # functions no test calls, and a branch no test takes, give no problems
    assert not any(p["entry_point"] in ("geometric_mean", "Inventory.report") for p in problems)
    assert "textkit/stats.py:23:9:line" not in ids  # raise in clamp: no test passes low > high
    assert info["counts"]["candidates_line"] > info["counts"]["exercised_line"]
    for p in problems:
        assert p["prompt"] + p["canonical_solution"] + p["suffix"] == (PROJECT / p["path"]).read_text()
        assert p["project"] == "project" and p["test_command"] == realcode.DEFAULT_TEST_COMMAND
        assert not realcode.is_test_file(Path(p["path"]))
    assert len(ids) == len(problems)


def test_shipped_problems_match_the_builder(built):
    shipped = realcode.load_jsonl(FIXTURE / "problems.jsonl")
    fresh = by_id(built[0])
    assert shipped and {p["task_id"] for p in shipped} <= set(fresh)  # mutation check only drops spans
    for p in shipped:
        assert p == fresh[p["task_id"]]
        assert realcode.project_dir(p, FIXTURE / "problems.jsonl") == PROJECT


def test_canonical_passes_and_wrong_fails():
    problems = by_id(realcode.load_jsonl(FIXTURE / "problems.jsonl"))
    line = problems["textkit/intervals.py:16:1:line"]
    cond = problems["textkit/stats.py:16:8:condition"]
    assert line["canonical_solution"] == "    return merged\n"
    records = realcode.score(
        [line, line, cond],
        [line["canonical_solution"], "    return merged[:1]\n", "n % 2 == 0"],
        problems_file=FIXTURE / "problems.jsonl",
    )
    assert [r["passed"] for r in records] == [True, False, False]
    assert records[0]["exact_match"] and not records[1]["exact_match"]
    assert "FAILED" in records[1]["stderr"] or "Error" in records[1]["stderr"]
    assert (PROJECT / "textkit" / "intervals.py").read_text().count(
        "return merged\n"
    ) == 1  # copy, not original


def test_a_span_the_tests_ignore_passes_when_broken(built):
    # why --mutation-check exists: clamp's `low > high` guard runs, but no test checks what it guards
    problem = {**by_id(built[0])["textkit/stats.py:22:8:condition"], "project": str(PROJECT)}
    (record,) = realcode.score([problem], [realcode.wrong_middle(problem)])
    assert realcode.wrong_middle(problem) == "False" and record["passed"] is True
    shipped = {p["task_id"] for p in realcode.load_jsonl(FIXTURE / "problems.jsonl")}
    assert problem["task_id"] not in shipped


def test_failing_suite_is_refused(tmp_path):
    project = shutil.copytree(PROJECT, tmp_path / "p")
    path = project / "textkit" / "stats.py"
    path.write_text(path.read_text().replace("return (ordered[middle - 1]", "return (ordered[middle]"))
    with pytest.raises(realcode.RealcodeError, match="do not pass"):
        realcode.build(project)


def test_test_command_forms():
    assert realcode.parse_test_command("python3 -m unittest -q") == ["-m", "unittest", "-q"]
    assert realcode.parse_test_command("run_tests.py -v") == ["run_tests.py", "-v"]
    with pytest.raises(realcode.RealcodeError):
        realcode.parse_test_command("python -c 'print(1)'")
    assert realcode.parse_test_command("python_tests.py") == ["python_tests.py"]  # a script, not python
    # an unbalanced quote (was shlex's ValueError), and commands the sandbox would run as a script `rm`
    for bad in ('python -m unittest "x', "rm -rf /", "python rm", "pytest -q"):
        with pytest.raises(realcode.RealcodeError, match="python -m MODULE"):
            realcode.parse_test_command(bad)
