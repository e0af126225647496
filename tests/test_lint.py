"""The tree stays ruff-clean (lint rules and formatting in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["engine", "server", "dfim", "tests", "scripts"]


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(exe).exists():
        pytest.skip("ruff is not installed (pip install '.[test]')")
    return subprocess.run([exe, *args, *PATHS], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_is_clean() -> None:
    result = ruff("check", "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = ruff("format", "--check", "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
