"""Shared test settings."""

from __future__ import annotations

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
