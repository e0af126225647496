"""Unit tests of dfim/commands/checks.py's model option check."""

from __future__ import annotations

import pytest

from dfim.commands.checks import model_folder
from dfim.commands.fill import InputError


def test_a_model_option_takes_a_folder_or_a_shipped_models_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder of a shipped model's name here
    model_folder("dfim-small")  # the shipped one, as `dfim fill` and the server resolve it
    model_folder(str(tmp_path))
    with pytest.raises(InputError, match=r"--model nope: no such folder \(shipped models: dfim-base"):
        model_folder("nope")
    with pytest.raises(InputError, match=r"no such folder$"):  # a path: no list of names
        model_folder(str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        model_folder(str(tmp_path / "file"))
