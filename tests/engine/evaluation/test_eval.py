"""`dfim eval`: data loading, sweeps, scoring of filled problems, and the command end to end."""

import gzip
import io
import json
import shutil
from pathlib import Path

import pytest

from dfim.cli import main
from dfim.engine.api import EngineError, SamplerSettings
from dfim.engine.evaluation import fim as ev
from dfim.engine.evaluation.sandbox import SandboxLimits

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "fixtures" / "eval" / "tiny-infilling.jsonl"
TOKENIZER = ROOT / "engine" / "weights" / "dfim-small" / "tokenizer.json"

SUMMARY_FIELDS = {
    "config",
    "settings",
    "max_tokens",
    "n",
    "passed",
    "pass_at_1",
    "exact_match",
    "edit_similarity",
    "mean_steps",
    "latency_p50_ms",
    "latency_p95_ms",
    "timeouts",
    "stop_reasons",
}
PROBLEM_FIELDS = {
    "task_id",
    "config",
    "raw",
    "completion",
    "passed",
    "timed_out",
    "exact_match",
    "edit_similarity",
    "steps",
    "stop_reason",
    "tokens",
    "latency_ms",
}


# ----------------------------------------------------------------------------- data


def test_load_problems_plain_and_gzip(tmp_path):
    plain = ev.load_problems(FIXTURE)
    assert [p.task_id for p in plain] == [
        "fixture/clamp/L2",
        "fixture/count_vowels/L3",
        "fixture/reverse_words/L1",
    ]
    gz = tmp_path / "tiny.jsonl.gz"
    with gzip.open(gz, "wb") as f:
        f.write(FIXTURE.read_bytes())
    assert ev.load_problems(gz) == plain
    assert len(ev.load_problems(gz, limit=2)) == 2


def test_load_problems_reports_bad_lines(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(FIXTURE.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(ev.DataError, match=r"bad.jsonl:2"):
        ev.load_problems(bad)
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"task_id": "x", "prompt": "p"}) + "\n")
    with pytest.raises(ev.DataError, match="suffix"):
        ev.load_problems(missing)
    with pytest.raises(ev.DataError):
        ev.load_problems(tmp_path / "absent.jsonl")
    for value in ("[1, 2, 3]", '"hello"'):  # valid JSON, but not a problem: was an AttributeError
        (tmp_path / "list.jsonl").write_text(value + "\n")
        with pytest.raises(ev.DataError, match=r"list.jsonl:1: not a JSON object"):
            ev.load_problems(tmp_path / "list.jsonl")
    corrupt = bytearray(gzip.compress(FIXTURE.read_bytes(), mtime=0))
    corrupt[20] ^= 0xFF  # inside the deflate stream: zlib.error, not an OSError
    (tmp_path / "corrupt.jsonl.gz").write_bytes(bytes(corrupt))
    with pytest.raises(ev.DataError, match=r"corrupt.jsonl.gz: cannot read"):
        ev.load_problems(tmp_path / "corrupt.jsonl.gz")


def test_first_line_keeps_one_line_and_ends_it():
    assert ev.first_line("    return x\n    more\n") == "    return x\n"
    assert ev.first_line("    return x") == "    return x\n"
    assert ev.first_line("") == "\n"


# ----------------------------------------------------------------------------- sweeps


def test_parse_sweep_grid_and_union():
    grid = ev.parse_sweep("steps=8,16;early_stop=on,off")
    assert grid == [
        {"max_steps": 8, "early_stop": True},
        {"max_steps": 8, "early_stop": False},
        {"max_steps": 16, "early_stop": True},
        {"max_steps": 16, "early_stop": False},
    ]
    union = ev.parse_sweep("steps=8;early_stop=off | entropy_bound=0.05,0.2 | bucket=64")
    assert union == [
        {"max_steps": 8, "early_stop": False},
        {"entropy_bound": 0.05},
        {"entropy_bound": 0.2},
        {"max_tokens": 64},
    ]
    for bad in ("temperature=1", "steps", "steps=", "early_stop=maybe", ""):
        with pytest.raises(ValueError):
            ev.parse_sweep(bad)
    # a field given twice in one grid kept only its last value: steps=8 was silently dropped
    with pytest.raises(ValueError, match="'steps'.*twice"):
        ev.parse_sweep("steps=8;steps=16")
    with pytest.raises(ValueError, match="'max_steps' sets the same field as 'steps'"):
        ev.parse_sweep("steps=8;max_steps=16")
    assert len(ev.parse_sweep("steps=8 | steps=16")) == 2  # in separate grids it is a comparison


def test_build_configs_applies_overrides_under_the_sweep():
    base = SamplerSettings()
    plain = ev.build_configs(base, 32, {"max_steps": 12}, None)
    assert len(plain) == 1 and plain[0].settings.max_steps == 12 and plain[0].max_tokens == 32
    configs = ev.build_configs(base, 32, {"entropy_bound": 0.2}, "steps=8,48;early_stop=on,off;max_tokens=64")
    assert [c.name for c in configs] == [
        "steps=8 early_stop=on max_tokens=64",
        "steps=8 early_stop=off max_tokens=64",
        "steps=48 early_stop=on max_tokens=64",
        "steps=48 early_stop=off max_tokens=64",
    ]
    assert all(c.settings.entropy_bound == 0.2 and c.max_tokens == 64 for c in configs)
    assert [c.settings.early_stop for c in configs] == [True, False, True, False]
    with pytest.raises(ValueError):
        ev.build_configs(base, 32, {}, "steps=8,8")


def test_early_stop_check_pairs_configs_that_differ_only_in_early_stop():
    def row(name, early_stop, steps, pass_at_1, max_steps=48):
        settings = {**SamplerSettings().__dict__, "early_stop": early_stop, "max_steps": max_steps}
        return {
            "config": name,
            "settings": settings,
            "max_tokens": 32,
            "mean_steps": steps,
            "pass_at_1": pass_at_1,
        }

    summary = [
        row("on", True, 12.0, 40.0),
        row("off", False, 48.0, 40.5),
        row("off16", False, 16.0, 30.0, 16),
    ]
    checks = ev.early_stop_checks(summary)
    assert len(checks) == 1
    assert checks[0]["on"] == "on" and checks[0]["off"] == "off"
    assert checks[0]["steps_ratio"] == 4.0 and checks[0]["target_met"]
    worse = ev.early_stop_checks([row("on", True, 12.0, 38.0), row("off", False, 48.0, 40.5)])
    assert not worse[0]["target_met"]


# ----------------------------------------------------------------------------- scoring


def test_reference_completions_all_pass():
    problems = ev.load_problems(FIXTURE)
    configs = ev.build_configs(SamplerSettings(), 32, {}, None)
    records = ev.evaluate(problems, configs, ev.reference_filler, workers=2)
    assert [r["passed"] for r in records] == [True, True, True]
    assert all(r["exact_match"] and r["edit_similarity"] == 100.0 for r in records)


def test_progress_in_a_log_is_a_few_distinct_lines_for_fills_and_tests():
    """issue 35: `dfim eval 2>log` wrote 34 identical "200/200 ... testing" lines and nothing while testing."""
    problems = ev.load_problems(FIXTURE) * 7  # 21 fills, 21 tests
    configs = ev.build_configs(SamplerSettings(), 32, {}, None)
    log = io.StringIO()
    records = ev.evaluate(problems, configs, ev.reference_filler, workers=2, progress=log)
    assert all(r["passed"] for r in records)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert len(lines) == len(set(lines)) <= 30
    fills = [x for x in lines if x.startswith("filling: ")]
    tests = [x for x in lines if x.startswith("testing: ")]
    assert fills and tests and len(fills) + len(tests) == len(lines)
    assert lines.index(fills[-1]) < lines.index(tests[0])  # the fills, then the tests
    assert fills[-1].startswith("filling: 21/21") and tests[-1].startswith("testing: 21/21")
    assert "pass 100.0%" in tests[-1]
    assert len(tests) > 2  # the testing phase shows its own progress, not one line at the end


def test_hanging_and_crashing_completions_fail_and_the_run_goes_on():
    problems = ev.load_problems(FIXTURE)
    bad = {
        "fixture/clamp/L2": "        while True: pass\n",  # hangs
        "fixture/count_vowels/L3": "        import os; os.abort()\n",  # crashes the interpreter
    }

    def filler(problem, config, seed):
        record = ev.reference_filler(problem, config, seed)
        record["raw"] = bad.get(problem.task_id, problem.canonical_solution) + "print('second line is cut')\n"
        return record

    configs = ev.build_configs(SamplerSettings(), 32, {}, None)
    limits = SandboxLimits(timeout_s=1.0)
    records = ev.evaluate(problems, configs, filler, workers=3, limits=limits, overlap=True)
    by_id = {r["task_id"]: r for r in records}
    assert by_id["fixture/clamp/L2"]["timed_out"] and not by_id["fixture/clamp/L2"]["passed"]
    assert (
        not by_id["fixture/count_vowels/L3"]["passed"] and not by_id["fixture/count_vowels/L3"]["timed_out"]
    )
    assert by_id["fixture/reverse_words/L1"]["passed"]
    assert by_id["fixture/reverse_words/L1"]["completion"] == "    words = s.split()\n"
    assert not by_id["fixture/clamp/L2"]["exact_match"]


def test_engine_error_fails_that_problem_only():
    problems = ev.load_problems(FIXTURE)

    def filler(problem, config, seed):
        if problem.task_id == "fixture/clamp/L2":
            raise EngineError("context too long")
        return ev.reference_filler(problem, config, seed)

    configs = ev.build_configs(SamplerSettings(), 32, {}, None)
    records = ev.evaluate(problems, configs, filler, workers=2)
    assert [r["passed"] for r in records] == [False, True, True]
    assert records[0]["error"] == "engine: context too long" and records[0]["stop_reason"] == "error"
    assert ev.summarize(records, configs)[0]["engine_errors"] == 1


# ----------------------------------------------------------------------------- the command


def _check_outputs(out: Path, n_configs: int) -> dict:
    results = json.loads((out / "results.json").read_text())
    assert set(results) >= {"meta", "summary", "early_stop_checks", "problems"}
    assert results["meta"]["data_sha256"] and results["meta"]["command"].startswith("dfim eval")
    assert len(results["summary"]) == n_configs
    for row in results["summary"]:
        assert SUMMARY_FIELDS <= set(row)
        assert row["n"] == 3
    assert len(results["problems"]) == 3 * n_configs
    for record in results["problems"]:
        assert PROBLEM_FIELDS <= set(record)
    fills = [json.loads(line) for line in (out / "fills.jsonl").read_text().splitlines()]
    assert [f["task_id"] for f in fills] == [r["task_id"] for r in results["problems"]]  # streamed as filled
    summary_md = (out / "summary.md").read_text()
    assert "| config | n | pass@1 % | EM % | ES | mean steps | p50 ms | p95 ms |" in summary_md
    table = [line for line in summary_md.splitlines() if line.startswith("|")]
    assert len(table) == 2 + n_configs  # header, rule, one row per config
    return results


def test_eval_command_reference_mode(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", str(FIXTURE), "--reference", "--out", str(out), "--quiet", "--workers", "2"]) == 0
    results = _check_outputs(out, 1)
    assert results["summary"][0]["pass_at_1"] == 100.0
    assert "| default | 3 | 100.0 |" in capsys.readouterr().out
    sandbox_meta = results["meta"]["sandbox"]
    assert sandbox_meta["cpu_s"] > 0  # the CPU limit in force (timeout + 1), not the 0 that means "derive"
    isolation = sandbox_meta["isolation"]  # what the tests ran under, and what was missing
    assert "pid_namespace" in isolation and isinstance(isolation["missing"], list)


def test_eval_command_rejects_bad_input(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "absent.jsonl"), "--reference", "--out", str(tmp_path)]) == 2
    assert main(["eval", str(FIXTURE), "--reference", "--sweep", "colour=red", "--out", str(tmp_path)]) == 2
    assert main(["eval", str(FIXTURE), "--reference", "--workers", "0", "--out", str(tmp_path)]) == 2
    assert "dfim eval:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "sweep, needle",
    [
        ("steps=8;steps=16", "twice"),
        ("t_max=5;t_min=-3", "t_min must be at least 0"),  # a negative temperature ran
        ("entropy_bound=nan", "entropy_bound"),  # NaN < 0 is False: it passed the floor
        ("confidence_threshold=-5", "confidence_threshold"),
        ("stability_threshold=-2", "stability_threshold"),
        ("t_max=-1", "t_max"),
    ],
)
def test_eval_sweep_values_are_checked_like_the_options(tmp_path, capsys, sweep, needle):
    out = tmp_path / "out"
    assert main(["eval", str(FIXTURE), "--reference", "--quiet", "--sweep", sweep, "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("dfim eval: --sweep") and needle in line
    assert not out.exists()


def test_eval_refuses_a_seed_past_int64_and_leaves_no_run_folder(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", str(FIXTURE), "--reference", "--seed", str(2**64), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("dfim eval: --seed")
    assert not out.exists()


def test_eval_out_that_cannot_be_made_is_one_line(capsys):
    # /proc passes the nearest-parent check as root, and mkdir fails: was a FileNotFoundError traceback
    argv = ["eval", str(FIXTURE), "--reference", "--quiet", "--out", "/proc/dfim-no-such/out"]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("dfim eval: --out /proc")


def test_eval_command_with_a_random_checkpoint(tmp_path):
    pytest.importorskip("dfim.engine.inference.fill", reason="the sampler's Engine has not landed")
    from dfim.engine.model.checkpoint import write_random_checkpoint

    model = write_random_checkpoint(tmp_path / "model", TOKENIZER)
    out = tmp_path / "out"
    argv = ["eval", str(FIXTURE), "--model", str(model), "--out", str(out), "--quiet", "--seed", "3"]
    argv += ["--steps", "2", "--max-tokens", "16", "--timeout", "5", "--sweep", "early_stop=on,off"]
    assert main(argv) == 0
    results = _check_outputs(out, 2)
    assert results["meta"]["model"]["is_random"]
    off = results["summary"][1]
    assert off["config"] == "early_stop=off" and off["mean_steps"] == 2  # no early stop: every step runs
    assert len(results["early_stop_checks"]) == 1
    for record in results["problems"]:
        assert record["completion"].endswith("\n") and record["completion"].count("\n") == 1
        assert 1 <= record["steps"] <= 2
    # the warm-up fills problem 0 too, but its timed fill still meets a cold cache, as every other one
    fills = [json.loads(line) for line in (out / "fills.jsonl").read_text().splitlines()]
    assert fills[0]["encoded_tokens"] == fills[0]["context_tokens"] > 0


def test_fixture_is_self_consistent(tmp_path):
    # the fixture's canonical lines really are one line, and a copy with CRLF-free text round-trips
    for problem in ev.load_problems(FIXTURE):
        assert problem.canonical_solution.count("\n") == 1 and problem.prompt.endswith("\n")
    shutil.copy(FIXTURE, tmp_path / "copy.jsonl")
    assert ev.load_problems(tmp_path / "copy.jsonl") == ev.load_problems(FIXTURE)
