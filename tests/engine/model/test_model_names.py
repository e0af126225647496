"""A model option names a folder, or a checkpoint the package ships by its bare name."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, WEIGHTS_DIR, resolve_checkpoint


def test_none_and_empty_are_the_default_model() -> None:
    assert resolve_checkpoint(None) == DEFAULT_MODEL_DIR
    assert resolve_checkpoint("") == DEFAULT_MODEL_DIR


@pytest.mark.parametrize(
    "name", sorted(p.name for p in WEIGHTS_DIR.iterdir() if (p / "config.json").is_file())
)
def test_a_shipped_checkpoint_by_its_name(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint(name) == WEIGHTS_DIR / name


def test_a_folder_where_the_user_is_wins_over_a_shipped_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_MODEL_DIR.name).mkdir()
    assert resolve_checkpoint(DEFAULT_MODEL_DIR.name) == Path(DEFAULT_MODEL_DIR.name)


def test_unknown_names_and_paths_stay_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint("no-such-model") == Path("no-such-model")
    assert resolve_checkpoint("runs/dfim-base") == Path("runs/dfim-base")
