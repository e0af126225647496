"""Shared test settings."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """In-process model tests use one torch thread: their matrices are tiny, and on a busy 2-core
    machine OpenMP's spinning threads make small products many times slower than one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def kernel_check() -> Callable[[str, str, dict[str, str]], None]:
    """Runs a kernel check script in a fresh interpreter (Triton's interpreter mode is chosen at import, so
    the environment must be set before Python starts): `check(code, device, env)` passes when the script,
    given the device as its argument, prints "ok"; else the failure shows what it printed."""

    def check(code: str, device: str, env: dict[str, str]) -> None:
        proc = subprocess.run(
            [sys.executable, "-c", code, device], env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr

    return check
