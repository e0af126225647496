"""dfim.bench.realcode.tracing: which test commands the sandbox can run."""

from __future__ import annotations

import pytest

from dfim.bench.realcode.tracing import RealcodeError, parse_test_command


def test_test_command_forms():
    assert parse_test_command("python3 -m unittest -q") == ["-m", "unittest", "-q"]
    assert parse_test_command("run_tests.py -v") == ["run_tests.py", "-v"]
    with pytest.raises(RealcodeError):
        parse_test_command("python -c 'print(1)'")
    assert parse_test_command("python_tests.py") == ["python_tests.py"]  # a script, not python
    # an unbalanced quote (was shlex's ValueError), and commands the sandbox would run as a script `rm`
    for bad in ('python -m unittest "x', "rm -rf /", "python rm", "pytest -q"):
        with pytest.raises(RealcodeError, match="python -m MODULE"):
            parse_test_command(bad)
