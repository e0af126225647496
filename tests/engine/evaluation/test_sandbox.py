"""The sandbox that runs model completions: correct code passes, everything else fails and is contained."""

import os
import time
from pathlib import Path

import pytest

from dfim.engine.evaluation.sandbox import SandboxLimits, humaneval_program, minimal_env, run_program

FAST = SandboxLimits(timeout_s=2.0)

PROMPT = 'def add(a, b):\n    """Sum of a and b."""\n'
SUFFIX = "\n"
TEST = "\n\ndef check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"


def humaneval(completion: str, limits: SandboxLimits = FAST):
    return run_program(humaneval_program(PROMPT, completion, SUFFIX, TEST, "add"), limits)


def test_known_correct_completion_passes():
    result = humaneval("    return a + b\n")
    assert result.passed and not result.timed_out and result.returncode == 0


def test_wrong_completion_fails():
    result = humaneval("    return a - b\n")
    assert not result.passed and not result.timed_out
    assert result.returncode == 1
    assert "AssertionError" in result.stderr


def test_syntax_error_fails():
    result = humaneval("    return a +\n")
    assert not result.passed
    assert "SyntaxError" in result.stderr


def test_hanging_completion_times_out_within_the_limit():
    limits = SandboxLimits(timeout_s=1.0)
    start = time.monotonic()
    result = humaneval("    while True: pass\n", limits)
    elapsed = time.monotonic() - start
    assert result.timed_out and not result.passed
    assert elapsed < 8.0  # killed near 1 s; generous bound for a loaded machine


def test_sleeping_completion_times_out():
    result = run_program("import time\ntime.sleep(60)\n", SandboxLimits(timeout_s=1.0))
    assert result.timed_out and not result.passed


def test_crashing_completion_fails():
    result = run_program("import os\nos.abort()\n", FAST)
    assert not result.passed and not result.timed_out
    assert result.returncode is not None and result.returncode < 0


def test_exit_status_decides():
    assert not run_program("raise SystemExit(3)\n", FAST).passed
    assert run_program("raise SystemExit(0)\n", FAST).passed


def test_environment_secrets_are_not_visible(monkeypatch):
    monkeypatch.setenv("DFIM_TEST_SECRET_TOKEN", "hunter2-secret")
    program = (
        "import os, sys\n"
        "leaked = 'DFIM_TEST_SECRET_TOKEN' in os.environ or any('hunter2' in v for v in os.environ.values())\n"
        "print(sorted(os.environ))\n"
        "sys.exit(1 if leaked else 0)\n"
    )
    result = run_program(program, FAST)
    assert result.passed, result.stdout + result.stderr
    assert "DFIM_TEST_SECRET_TOKEN" not in result.stdout
    assert set(minimal_env()) == {"PATH", "LANG"}


def test_memory_bomb_is_contained():
    limits = SandboxLimits(timeout_s=5.0, memory_bytes=256 << 20)
    result = run_program("x = bytearray(4 << 30)\n", limits)
    assert not result.passed and not result.timed_out
    assert "MemoryError" in result.stderr
    growing = run_program("chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))\n", limits)
    assert not growing.passed and not growing.timed_out
    assert "MemoryError" in growing.stderr


def test_standard_library_works_but_site_packages_do_not():
    stdlib = run_program(
        "import collections, fractions, functools, hashlib, heapq, itertools, json, math, re, string, typing\n"
        "assert math.gcd(12, 18) == 6 and hashlib.md5(b'x').hexdigest()\n",
        FAST,
    )
    assert stdlib.passed, stdlib.stderr
    third_party = run_program("import pytest\n", FAST)  # installed in this venv, invisible to -I -S
    assert not third_party.passed and "ModuleNotFoundError" in third_party.stderr


def test_stdin_is_closed():
    result = run_program("input()\n", FAST)
    assert not result.passed and not result.timed_out
    assert "EOFError" in result.stderr


def test_runs_in_a_fresh_temporary_directory_that_is_removed():
    program = "import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd())\n"
    result = run_program(program, FAST)
    assert result.passed
    workdir = Path(result.stdout.strip())
    assert workdir != Path.cwd()
    assert not workdir.exists()


def test_output_is_truncated_to_its_tail():
    limits = SandboxLimits(timeout_s=5.0, output_chars=100)
    result = run_program("print('a' * 100000)\nprint('END')\n", limits)
    assert result.passed
    assert len(result.stdout) <= 100
    assert result.stdout.rstrip().endswith("END")


def test_file_size_is_limited():
    limits = SandboxLimits(timeout_s=5.0, file_bytes=1 << 20)
    result = run_program("open('big', 'wb').write(b'x' * (8 << 20))\n", limits)
    assert not result.passed


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie is dead, only not yet reaped
    except (FileNotFoundError, ProcessLookupError):
        return False


def _with_token(token: str) -> list[int]:
    """Live processes whose command line holds `token`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and token.encode() in (proc / "cmdline").read_bytes()
                and _alive(int(proc.name))
            ):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_background_children_are_killed_with_the_group():
    # found by a token in its command line: a pid printed inside a PID namespace means nothing outside it
    token = f"dfim-background-{os.getpid()}-{time.monotonic_ns()}"
    program = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {token!r}])\n"
    result = run_program(program, FAST)
    assert result.passed, result.stderr
    deadline = time.monotonic() + 5.0
    while _with_token(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _with_token(token)


@pytest.mark.parametrize("timeout_s", [float("inf"), 1e300])
def test_limits_too_large_to_set_are_no_limits(timeout_s):
    # int(inf) and setrlimit of a value past a C long raised (OverflowError) or failed every program; and
    # Linux kills a child at once under some huge CPU limits (2**62 s)
    limits = SandboxLimits(timeout_s=timeout_s, memory_bytes=1 << 70)
    result = run_program("print(sum(range(10**5)))\n", limits)
    assert result.passed, result.stderr
    assert result.stdout.strip() == str(sum(range(10**5)))
