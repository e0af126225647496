"""Shared test settings."""

from __future__ import annotations

import importlib.util
import os
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


@pytest.fixture(params=["cuda", "interpreter"])
def kernel_target(request) -> tuple[str, dict[str, str]]:
    """Where a Triton kernel check runs, as (device, environment): on CUDA, and on the CPU under Triton's
    interpreter with the fast path's kernels applying to CPU tensors (`triton_norm.interpreting`). Each skips
    where it cannot run (CI has neither Triton nor a GPU)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs CUDA")
        return "cuda", dict(os.environ)
    return "cpu", {**os.environ, "TRITON_INTERPRET": "1", "DFIM_TRITON_ON_CPU": "1"}
