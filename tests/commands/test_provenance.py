"""The environment record of result files and `dfim --version` (dfim/commands/provenance.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dfim.commands import provenance

ROOT = Path(__file__).resolve().parents[2]
EVAL_FIXTURE = ROOT / "fixtures" / "eval" / "tiny-infilling.jsonl"
REALCODE = ROOT / "fixtures" / "realcode" / "problems.jsonl"
FIELDS = {"dfim", "commit", "modified", "torch", "device", "threads", "usable_cores", "cpu", "python"}


def test_the_record_names_version_commit_torch_device_threads_and_cpu():
    import torch

    env = provenance.environment("cpu")
    assert FIELDS <= set(env)
    assert env["torch"] == torch.__version__ and env["device"] == "cpu"
    assert env["threads"] == torch.get_num_threads() and env["usable_cores"] >= 1
    assert env["cpu"] and env["dfim"]
    json.dumps(env)  # goes into result files as it is
    if (ROOT / ".git").exists():  # run from a checkout: the commit is HEAD's
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert env["commit"] == head.stdout.strip()


def test_no_checkout_no_git_falls_back_to_none(tmp_path, monkeypatch):
    assert provenance.git_commit.__wrapped__(tmp_path) == (None, None)  # not a checkout
    (tmp_path / ".git").mkdir()  # looks like one, but holds no HEAD
    assert provenance.git_commit.__wrapped__(tmp_path) == (None, None)
    text = provenance.version_text({**provenance.environment("cpu"), "commit": None, "modified": None})
    assert "no git checkout" in text


def test_version_prints_the_same_record():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "dfim", "--version"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    record = provenance.environment()
    out = proc.stdout
    assert out.startswith(f"dfim {record['dfim']}")
    if record["commit"]:
        assert record["commit"][:12] in out
    for needle in (f"torch {record['torch']}", "threads", record["cpu"], f"device {record['device']}"):
        assert needle in out, (needle, out)


def run_dfim(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "dfim", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_eval_results_carry_the_environment(tmp_path):
    out = tmp_path / "eval"
    proc = run_dfim(
        "eval", EVAL_FIXTURE, "--reference", "--quiet", "--workers", "1", "--out", out, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert FIELDS <= set(meta["environment"]) and meta["seed"] == 0


@pytest.mark.slow
def test_realcode_results_carry_the_environment(tmp_path):
    out = tmp_path / "realcode"
    proc = run_dfim(
        "bench-realcode", "score", REALCODE, "--reference", "--limit", "1", "--out", out, cwd=tmp_path
    )
    assert proc.returncode in (0, 1), proc.stderr
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert FIELDS <= set(meta["environment"])
