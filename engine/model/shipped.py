"""The checkpoints dfim ships and how a model option names them: paths only, no torch, so the CLI can check
an option before it imports the engine."""

from __future__ import annotations

import os
from pathlib import Path

from dfim.engine.api import CheckpointError

WEIGHTS_DIR = Path(__file__).parents[1] / "weights"  # the checkpoints the package ships
DEFAULT_MODEL_DIR = WEIGHTS_DIR / "dfim-base"


def resolve_checkpoint(path: str | os.PathLike | None) -> Path:
    """The folder a model option names: the default model for None, a shipped checkpoint for its bare name
    (`dfim-base`) unless a folder of that name exists where the user is, else the path itself."""
    if path is None or str(path) == "":
        return DEFAULT_MODEL_DIR
    folder = Path(path)
    shipped = WEIGHTS_DIR / str(path)
    if not folder.exists() and len(folder.parts) == 1 and (shipped / "config.json").is_file():
        return shipped
    return folder


def is_served_url(path: str | os.PathLike | None) -> bool:
    """Whether a model option names a model served by `vllm serve` rather than a checkpoint folder or a
    shipped name."""
    return bool(path) and str(path).startswith(("http://", "https://"))


def shipped_models() -> list[str]:
    """The names `resolve_checkpoint` takes for the checkpoints shipped with dfim (in the wheel or the
    checkout)."""
    if not WEIGHTS_DIR.is_dir():
        return []
    return sorted(p.name for p in WEIGHTS_DIR.iterdir() if (p / "config.json").is_file())


def names_note(folder: Path) -> str:
    """What to add to "no such folder" for a model option: a bare name gets the shipped models' names."""
    names = shipped_models() if len(folder.parts) == 1 else []
    return f" (shipped models: {', '.join(names)})" if names else ""


def folder_not_found(folder: Path) -> CheckpointError:
    """The error for a model option naming no folder."""
    return CheckpointError(f"{folder}: checkpoint folder not found{names_note(folder)}")
