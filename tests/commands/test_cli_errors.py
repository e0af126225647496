"""Bad command-line input, command by command, run as real subprocesses: one line on stderr naming the
option or file, exit status 2, no traceback, no hang (every run has a timeout), nothing done silently."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "engine" / "weights" / "dfim-small" / "tokenizer.json"
EVAL_FIXTURE = ROOT / "fixtures" / "eval" / "tiny-infilling.jsonl"
REALCODE = ROOT / "fixtures" / "realcode" / "problems.jsonl"


def cli(*args: object, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m dfim ARGS`."""
    words = [str(a) for a in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "dfim", *words],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_refused(proc: subprocess.CompletedProcess, prog: str, *needles: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Inputs shared by the tests: a plain file, a source file, a binary one, shards, checkpoints."""
    tmp = tmp_path_factory.mktemp("inputs")
    made = {"tmp": tmp, "file": tmp / "a_file", "empty_dir": tmp / "empty"}
    made["file"].write_text("not a folder\n")
    made["empty_dir"].mkdir()
    made["source"] = tmp / "ok.py"
    made["source"].write_text("x = 1\ny = x\n")
    made["binary"] = tmp / "bin.py"
    made["binary"].write_bytes(b"x = 1\x00\x01\n")
    made["latin1"] = tmp / "latin.py"
    made["latin1"].write_bytes(b'x = "\xe9"\n')
    made["unknown"] = tmp / "notes.xyz"
    made["unknown"].write_text("hello\n")
    # Shards as `dfim data` leaves them for a root without files: an empty index.
    made["no_docs"] = tmp / "no_docs"
    made["no_docs"].mkdir()
    np.save(made["no_docs"] / "train_docs.npy", np.zeros((0, 3), dtype=np.int64))
    # A checkpoint whose config reads but whose weights are garbage.
    made["corrupt"] = tmp / "corrupt"
    made["corrupt"].mkdir()
    config = (ROOT / "engine" / "weights" / "dfim-small" / "config.json").read_text()
    (made["corrupt"] / "config.json").write_text(config)
    (made["corrupt"] / "model.safetensors").write_bytes(os.urandom(64))
    return made


# ----------------------------------------------------------------------------- dfim train


@pytest.fixture(scope="module")
def shards(files: dict[str, Path]) -> Path:
    """Token shards that pass the data checks: one file of 50 tokens."""
    data = files["tmp"] / "shards"
    data.mkdir()
    np.save(data / "train_docs.npy", np.array([[0, 0, 50]], dtype=np.int64))
    np.zeros(51, dtype=np.uint16).tofile(data / "train_000.bin")
    return data


def expand(args: list[str], files: dict[str, Path]) -> list[str]:
    """`@name` and `@name/rest` stand for the paths of the `files` fixture."""
    out = []
    for a in args:
        if a.startswith("@"):
            key, _, rest = a[1:].partition("/")
            a = str(files[key] / rest) if rest else str(files[key])
        out.append(a)
    return out


# case: (arguments after --data SHARDS --out RUN, words the message must hold). As subprocesses (each
# pays torch's import, about 2 s): the findings of the review.
TRAIN_CASES = {
    "data_missing": (["--data", "@tmp/absent"], ("--data", "no such folder")),
    "data_empty": (["--data", "@no_docs"], ("--data", "no training files")),  # was an IndexError
    "batch_size_0": (["--batch-size", "0"], ("--batch-size", "at least 1")),  # waited forever for a batch
    "steps_negative": (["--steps", "-1"], ("--steps",)),  # exported an untrained model, "random": false
    "unknown_config_key": (["--model-config", '{"bad": 1}'], ("--model-config", "'bad'")),  # was dropped
    "corrupt_init": (["--init-from", "@corrupt", "--device", "cpu", "--workers", "0"], ("corrupt",)),
}
# The same checks in-process, through the command's own entry point (dfim.cli.main).
MORE_TRAIN_CASES = {
    "out_is_file": (["--out", "@file"], ("--out", "not a folder")),
    "data_is_file": (["--data", "@file"], ("--data", "not a folder")),
    "data_without_shards": (["--data", "@empty_dir"], ("--data", "train_docs.npy")),
    "bogus_config": (["--model-config", "bogus"], ("--model-config", "bogus")),
    "bad_json_config": (["--model-config", "{nope"], ("--model-config", "JSON")),
    "init_missing": (["--init-from", "@tmp/absent"], ("--init-from", "no such folder")),
    "tokenizer_missing": (["--tokenizer", "@tmp/absent.json"], ("--tokenizer", "no such file")),
    "buckets_abc": (["--buckets", "abc"], ("--buckets", "abc")),
    "lr_0": (["--lr", "0"], ("--lr",)),
    "context_tokens_0": (["--context-tokens", "0"], ("--context-tokens",)),
    "minutes_negative": (["--minutes", "-1"], ("--minutes",)),
    "minutes_within_reserve": (["--minutes", "0.1"], ("--minutes", "--reserve-seconds")),
    "span_mix": (["--span-mix", "1,2"], ("--span-mix",)),
    "cross_file_p": (["--cross-file-p", "2"], ("--cross-file-p", "[0, 1]")),
    "cross_file_without_manifest": (["--cross-file-p", "0.3"], ("--cross-file-p", "manifest.jsonl")),
}


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_train_refuses(case: str, files: dict[str, Path], shards: Path) -> None:
    extra, needles = TRAIN_CASES[case]
    run = files["tmp"] / f"run-{case}"
    args = ["--data", shards, "--out", run, *expand(extra, files)]
    assert_refused(cli("train", *args, cwd=files["tmp"], timeout=120), "dfim train", *needles)
    if case != "corrupt_init":  # (that one is only found when the weights are read)
        assert not run.exists()  # refused before anything was written


def test_train_refuses_more(files: dict[str, Path], shards: Path, capsys: pytest.CaptureFixture) -> None:
    import torch

    from dfim.cli import main

    cases = dict(MORE_TRAIN_CASES)
    if not torch.cuda.is_available():
        cases["device_cuda"] = (["--device", "cuda"], ("--device", "CUDA is not available"))
    for case, (extra, needles) in cases.items():
        run = files["tmp"] / f"run-{case}"
        code = main(["train", "--data", str(shards), "--out", str(run), *expand(extra, files)])
        err = capsys.readouterr().err
        assert_refused(subprocess.CompletedProcess([], code, "", err), "dfim train", *needles)
        assert not run.exists(), case


def test_model_config_names_unknown_keys() -> None:
    from dfim.engine.model.config import ModelConfig

    with pytest.raises(ValueError, match="'colour'"):
        ModelConfig.from_dict({"hidden_size": 64, "colour": "red"})


# ----------------------------------------------------------------------------- dfim replay


def test_replay_refuses_bad_options_and_files(files: dict[str, Path]) -> None:
    tmp, source = files["tmp"], files["source"]
    cases = [
        ([source, "--min-partial", "0"], ("--min-partial", "at least 1")),  # looped forever
        ([source, "--min-partial", "-2"], ("--min-partial",)),
        ([source, "--steps", "0"], ("--steps",)),
        ([source, "--max-canvas", "8"], ("--max-canvas", "[16, 256]")),  # the server's own bounds
        ([source, "--every", "0"], ("--every",)),
        ([source, "--max-chars", "0"], ("--max-chars",)),
        ([files["binary"]], ("bin.py", "binary")),
        ([files["latin1"]], ("latin.py", "not UTF-8")),
        ([files["unknown"]], ("notes.xyz", "unknown file type")),
        ([tmp / "absent.py"], ("absent.py", "no such file")),
        (["--git", tmp / "absent"], ("--git", "no such folder")),
        (["--git", files["empty_dir"]], ("--git", "not a git repository")),
        (["--git", ROOT, "--rev", "no-such-revision-xyz"], ("no-such-revision-xyz", "unknown revision")),
        ([source, "--commits", "3"], ("--commits", "need --git")),  # was silently ignored
        ([source, "--rev", "HEAD~2"], ("--rev", "need --git")),
        ([source, "--out", files["file"]], ("--out", "not a folder")),
        ([source, "--model", tmp / "no-model"], ("--model", "no such folder")),
        ([source, "--model", "no-model"], ("--model", "shipped models: dfim-base")),  # a bare name: the names
        ([source, "--settings", "{inline: 1}"], ("--settings", "not JSON")),
        ([source, "--settings", "[1]"], ("--settings", "JSON object")),
        ([source, "--settings", '{"nope": 1}'], ("--settings", "unknown setting dfim.nope")),
        ([source, "--settings", '{"inline": {"candidates": 0}}'], ("--settings", "dfim.inline.candidates")),
        # passes the ancestor check as root (/proc is writable) but cannot be made: refused before the
        # replay runs, not with a traceback after it
        ([source, "--out", "/proc/dfim-no-such/out"], ("--out", "/proc")),
    ]
    for args, needles in cases:
        assert_refused(cli("replay", *args, cwd=tmp), "dfim replay", *needles)
    # a folder that is no checkpoint fails in the server: one line (the server's showMessage is not a
    # second one), and no empty --out folder left behind
    (tmp / "not-a-model").mkdir(exist_ok=True)
    (tmp / "not-a-model" / "config.json").write_text("{}")
    proc = cli("replay", source, "--model", tmp / "not-a-model", "--out", tmp / "rx", cwd=tmp)
    assert_refused(proc, "dfim replay", "could not load the model")
    assert not (tmp / "rx").exists()


def test_replay_partial_accepts_are_never_empty() -> None:
    from dfim.bench.replay import judge

    # a suggestion sharing nothing with what comes next: rejected even with min_partial 0
    assert judge("x = \n", 4, 4, 4, "abc", "zzz\n", 0) == ("rejected", 0)


def test_replay_stops_its_server_when_terminated(files: dict[str, Path]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dfim",
            "replay",
            str(ROOT / "engine" / "evaluation" / "metrics.py"),
            "--quiet",
        ]
        + ["--out", str(files["tmp"] / "replay-out")],
        cwd=files["tmp"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def children() -> list[int]:
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == proc.pid:
                found.append(int(stat.parent.name))
        return found

    try:
        deadline = time.monotonic() + 30
        while not (server := children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server, "the replay never started its server"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
    time.sleep(0.2)
    for pid in server:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone
        assert state == "Z", f"dfim serve {pid} still running after the replay was terminated"


# ----------------------------------------------------------------------------- dfim bench-realcode


def test_realcode_score_refuses_bad_input(files: dict[str, Path]) -> None:
    tmp = files["tmp"]
    moved = tmp / "moved.jsonl"  # relative `project` paths that no longer resolve
    moved.write_text(REALCODE.read_text())
    (tmp / "not.json").write_text("nope\n")
    (tmp / "empty.jsonl").write_text("\n")
    (tmp / "completions.jsonl").write_text('{"task_id": 1}\n')
    cases = [
        ([moved, "--reference"], ("moved.jsonl:1", "project folder", "does not exist")),
        ([tmp / "absent.jsonl", "--reference"], ("absent.jsonl", "no such file")),
        ([tmp / "not.json", "--reference"], ("not.json:1", "not JSON")),
        ([EVAL_FIXTURE, "--reference"], ("project", "dfim eval")),
        ([tmp / "empty.jsonl", "--reference"], ("no problems",)),
        ([REALCODE, "--completions", tmp / "absent.jsonl"], ("--completions", "no such file")),
        ([REALCODE, "--completions", tmp / "completions.jsonl"], ("--completions", "task_id")),
        ([REALCODE, "--reference", "--out", files["file"]], ("--out", "not a folder")),
        ([REALCODE, "--reference", "--limit", "0"], ("--limit",)),
        ([REALCODE, "--reference", "--limit", "-2"], ("--limit",)),  # a slice: scored 89 problems
        ([REALCODE, "--model", "default", "--max-tokens", "0"], ("--max-tokens",)),
    ]
    for args, needles in cases:
        assert_refused(cli("bench-realcode", "score", *args, cwd=tmp), "dfim bench-realcode", *needles)
    build = cli("bench-realcode", "build", ROOT / "fixtures" / "realcode" / "project", "--out", tmp, cwd=tmp)
    assert_refused(build, "dfim bench-realcode", "--out", "is a folder")
    more = [
        ([REALCODE, "--reference", "--timeout", "inf"], ("--timeout",)),  # an OverflowError traceback
        ([REALCODE, "--reference", "--memory-mb", "100000000000000"], ("--memory-mb",)),
        ([REALCODE, "--model", "default", "--seed", str(2**64)], ("--seed",)),
        ([REALCODE, "--reference", "--out", "/proc/dfim-no-such/out"], ("--out", "/proc")),
    ]
    for args, needles in more:
        assert_refused(cli("bench-realcode", "score", *args, cwd=tmp), "dfim bench-realcode", *needles)
    # a folder that is no checkpoint fails at load: one line, and no empty --out folder left behind
    (tmp / "fakeckpt").mkdir()
    (tmp / "fakeckpt" / "config.json").write_text("{}")
    proc = cli("bench-realcode", "score", REALCODE, "--model", tmp / "fakeckpt", "--out", tmp / "sx", cwd=tmp)
    assert_refused(proc, "dfim bench-realcode", "fakeckpt")
    assert not (tmp / "sx").exists()


def test_realcode_build_refuses_a_test_command_it_cannot_run(files: dict[str, Path]) -> None:
    tmp, project = files["tmp"], ROOT / "fixtures" / "realcode" / "project"
    out = tmp / "built" / "problems.jsonl"
    cases = [
        ('python -m unittest "x', ("--test-command", "No closing quotation")),  # shlex's ValueError
        ("rm -rf /", ("--test-command", "python SCRIPT.py")),  # was run as a Python script named `rm`
        ("python missing_runner.py", ("--test-command", "missing_runner.py", "no such script")),
    ]
    for command, needles in cases:
        proc = cli("bench-realcode", "build", project, "--out", out, "--test-command", command, cwd=tmp)
        assert_refused(proc, "dfim bench-realcode", *needles)
    assert not out.parent.exists()  # refused before anything ran or was made
    proc = cli("bench-realcode", "build", project, "--out", "/proc/dfim-no-such/p.jsonl", cwd=tmp)
    assert_refused(proc, "dfim bench-realcode", "--out", "/proc")


def test_realcode_reference_below_100_is_a_warning_and_exit_1(files: dict[str, Path]) -> None:
    out = files["tmp"] / "realcode-ref"
    proc = cli(
        "bench-realcode", "score", REALCODE, "--reference", "--limit", "1", "--memory-mb", "5", "--out", out,
        cwd=files["tmp"],
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    *progress, line = proc.stderr.strip().splitlines()  # the suites' progress lines, then the warning
    assert all(p.startswith("testing: ") for p in progress)
    assert "warning" in line and "0/1" in line and "harness" in line
    assert (out / "results.json").is_file()


# ----------------------------------------------------------------------------- dfim eval


def test_eval_refuses_bad_options_before_loading_a_model(files: dict[str, Path]) -> None:
    tmp = files["tmp"]
    absent_model = ["--model", tmp / "no-model"]  # loading it would fail: the option is refused first
    cases = [
        (["--memory-mb", "0"], ("--memory-mb",)),
        (["--memory-mb", "-5"], ("--memory-mb",)),
        (["--entropy-bound", "-0.5"], ("--entropy-bound",)),
        (["--out", files["file"]], ("--out", "not a folder")),
        (["--sweep", "steps=abc"], ("--sweep", "'steps'", "abc")),
        (["--sweep", "early_stop=maybe"], ("--sweep", "'early_stop'")),
        (["--memory-mb", "5"], ("sandbox", "--memory-mb")),  # every test would die: pass@1 0 of nothing
        (["--timeout", "inf"], ("--timeout", "inf")),  # was an OverflowError traceback in the sandbox
        (["--timeout", "nan"], ("--timeout", "nan")),
        (["--timeout", "1e300"], ("--timeout", "86400")),  # overflowed setrlimit: "raise --timeout"
        (["--memory-mb", "100000000000000"], ("--memory-mb", "1073741824")),
        (["--seed", "99999999999999999999"], ("--seed", "64-bit")),  # torch's generator overflowed
    ]
    for args, needles in cases:
        assert_refused(cli("eval", EVAL_FIXTURE, *absent_model, *args, cwd=tmp), "dfim eval", *needles)


def test_eval_reference_below_100_is_a_warning_and_exit_1(files: dict[str, Path]) -> None:
    out = files["tmp"] / "eval-ref"
    proc = cli(
        "eval", EVAL_FIXTURE, "--reference", "--memory-mb", "5", "--quiet", "--workers", "1", "--out", out,
        cwd=files["tmp"],
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("dfim eval: warning") and "0/3" in line and "harness" in line
    assert json.loads((out / "results.json").read_text())["summary"][0]["pass_at_1"] == 0.0


def test_eval_script_uses_the_repository_environment() -> None:
    script = (ROOT / "scripts" / "eval_humaneval.sh").read_text()
    assert ".venv/bin/python" in script and 'dfim=("$PYTHON" -m dfim.cli eval' in script
    assert "dfim=(python " not in script


def test_a_bad_generation_config_names_its_file_and_key(files: dict[str, Path], capsys) -> None:
    from dfim.cli import main
    from dfim.engine.api import CheckpointError
    from dfim.engine.model.checkpoint import read_settings

    folder = files["tmp"] / "gen-config"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (folder / name).write_bytes((ROOT / "engine" / "weights" / "dfim-small" / name).read_bytes())
    for config, key in [
        ({"max_denoising_steps": "abc"}, "max_denoising_steps"),  # was int()'s ValueError, a traceback
        ({"max_denoising_steps": 0}, "max_denoising_steps"),  # named no file: "max_steps must be at least 1"
        ({"t_max": [1]}, "t_max"),
        ({"sampler_config": {"entropy_bound": "NaN"}}, "entropy_bound"),
        ({"sampler_config": "fast"}, "sampler_config"),  # was an AttributeError
    ]:
        (folder / "generation_config.json").write_text(json.dumps(config))
        with pytest.raises(CheckpointError, match=f"generation_config.json: bad {key}"):
            read_settings(folder)
    # through `dfim fill`: one line, status 2 (the settings are read before the weights)
    code = main(["fill", str(files["source"]), "--line", "1", "--col", "1", "--model", str(folder)])
    assert_refused(
        subprocess.CompletedProcess([], code, "", capsys.readouterr().err), "dfim fill", "sampler_config"
    )


# ----------------------------------------------------------------------------- dfim stats


def test_stats_skips_malformed_events_and_says_no_telemetry_on_stderr(files: dict[str, Path]) -> None:
    tmp = files["tmp"] / "telemetry"
    good = '{"event": "shown", "id": "a", "latencyMs": 80.0}\n{"event": "accepted", "id": "a", "acceptedChars": 5}\n'
    bad = [
        '{"event": "accepted", "id": "b", "acceptedChars": "lots"}',  # was int()'s ValueError
        '{"event": "rejected", "id": ["b"]}',  # was "unhashable type: 'list'"
        '{"event": "shown", "id": "c", "latencyMs": NaN}',  # counted as shown; the latency made p50 NaN
    ]
    tmp.mkdir()
    (tmp / "telemetry.jsonl").write_text(good + "\n".join(bad) + "\n")
    proc = cli("stats", "--data-dir", tmp, "--json", cwd=files["tmp"])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr

    def strict(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")

    summary = json.loads(proc.stdout, parse_constant=strict)
    assert (summary["shown"], summary["accepted"], summary["accepted_chars"]) == (2, 1, 5)
    assert summary["latency_p50"] == 80.0
    # no telemetry: the line goes to stderr, so `--json | jq` never reads it as the summary
    empty = files["tmp"] / "no-telemetry"
    empty.mkdir()
    proc = cli("stats", "--data-dir", empty, "--json", cwd=files["tmp"])
    assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.startswith("dfim stats: no telemetry")
    # a file where the folder should be, and a folder where the file should be
    assert_refused(cli("stats", "--data-dir", files["file"], cwd=tmp), "dfim stats", "not a folder")
    assert_refused(cli("stats", "--gate-threshold", "5", cwd=tmp), "dfim stats", "--gate-threshold")
    (empty / "telemetry.jsonl").mkdir()
    assert_refused(cli("stats", "--data-dir", empty, cwd=tmp), "dfim stats", "telemetry.jsonl", "cannot read")


def test_stats_into_a_closed_pipe_stops_quietly(files: dict[str, Path]) -> None:
    """`dfim stats | head -1`: the reader leaves early; that is no error worth a traceback."""
    tmp = files["tmp"] / "telemetry-pipe"
    tmp.mkdir()
    (tmp / "telemetry.jsonl").write_text('{"event": "shown", "id": "a", "latencyMs": 80.0}\n')
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the command writes a byte: its first print hits EPIPE
    proc = subprocess.run(
        [sys.executable, "-m", "dfim", "stats", "--data-dir", str(tmp)],
        cwd=files["tmp"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    os.close(write_end)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr


def test_a_missing_dependency_is_named_not_a_traceback(files: dict[str, Path]) -> None:
    """torch is imported only when a command runs: without it, one line that says what to do."""
    stub = files["tmp"] / "no-torch"
    stub.mkdir()
    (stub / "torch.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stub), str(ROOT)])}
    for command in ("fill", "trace"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "dfim",
                command,
                str(ROOT / "fixtures" / "demo.py"),
                "--line",
                "8",
                "--col",
                "12",
            ],
            cwd=files["tmp"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert_refused(proc, "dfim", f"'{command}' command is not available", "torch", "./install.sh")


# ----------------------------------------------------------------------------- dfim serve


def test_serve_refuses_bad_tcp_and_log_file(files: dict[str, Path]) -> None:
    tmp = files["tmp"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        in_use = cli("serve", "--tcp", f"127.0.0.1:{port}", cwd=tmp)
    assert_refused(in_use, "dfim serve", "--tcp", str(port), "in use")
    assert_refused(cli("serve", "--tcp", "999.1.1.1:4000", cwd=tmp), "dfim serve", "--tcp", "999.1.1.1")
    assert_refused(
        cli("serve", "--log-file", tmp / "absent" / "log.txt", cwd=tmp), "dfim serve", "--log-file", "No such"
    )
    assert_refused(cli("serve", "--log-file", tmp, cwd=tmp), "dfim serve", "--log-file", "directory")
    assert_refused(
        cli("serve", "--token-file", tmp / "t.tok", cwd=tmp), "dfim serve", "--token-file", "--tcp"
    )
    # a model that is not there is named at once on stderr, with the shipped names; the server still starts
    # (it reports the model to the editor, whose settings may name another) and exits 0 when its input closes
    for model, needles in (("bogus", ("--model bogus", "dfim-base")), (tmp / "nope", ("no such folder",))):
        proc = cli("serve", "--model", model, cwd=tmp)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("dfim serve: warning: --model"), proc.stderr
        assert all(needle in proc.stderr for needle in needles), proc.stderr
    # so is a GPU that is not there (this suite runs where PyTorch sees none)
    import torch

    if not torch.cuda.is_available():
        proc = cli("serve", "--device", "cuda", cwd=tmp)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("dfim serve: warning: --device cuda"), proc.stderr
        assert "model.device" in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- dfim data


def test_data_builder_refuses_bad_input(files: dict[str, Path]) -> None:
    tmp = files["tmp"]
    out = tmp / "built"
    common = ["--out", out, "--tokenizer", TOKENIZER, "--workers", "1", "--eval-data"]
    cases = [
        ([*common, "--roots", tmp / "absent"], ("--roots", "no such folder")),  # reported 0 files, exit 0
        ([*common, "--roots", files["empty_dir"]], ("no .py files",)),
        ([*common, "--roots", files["empty_dir"], "--val-fraction", "0"], ("--val-fraction",)),
        ([*common, "--roots", files["empty_dir"], "--val-fraction", "1.5"], ("--val-fraction",)),
        (["--out", out, "--tokenizer", tmp / "absent.json", "--roots", tmp], ("--tokenizer", "no such file")),
        (["--out", files["file"], "--tokenizer", TOKENIZER, "--roots", tmp], ("--out", "not a folder")),
    ]
    for args, needles in cases:
        assert_refused(cli("data", *args, cwd=tmp), "dfim data", *needles)
    assert not (out / "meta.json").exists()


def test_serve_exits_0_when_its_input_closes():
    done = subprocess.run(
        [sys.executable, "-m", "dfim", "serve"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-500:]
