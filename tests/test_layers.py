"""The layers of docs/architecture.md hold: the engine imports neither the server nor the command line,
and parsers live only in the command line."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` in the file names, at any depth."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_engine_imports_neither_the_server_nor_the_command_line() -> None:
    forbidden = ("dfim.server", "dfim.commands", "dfim.bench", "dfim.cli")
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in imported_modules(path) if m.startswith(forbidden))
        for path in (ROOT / "engine").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_server_does_not_import_the_command_line() -> None:
    forbidden = ("dfim.commands", "dfim.bench", "dfim.cli")
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in imported_modules(path) if m.startswith(forbidden))
        for path in (ROOT / "server").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_bare_engine_or_server_imports_remain() -> None:
    """Only `dfim` is installed: `import engine` would work from a checkout and fail for every user."""
    offenders = {}
    for folder in ("engine", "server", "dfim", "tests", "scripts"):
        for path in (ROOT / folder).rglob("*.py"):
            bare = sorted(m for m in imported_modules(path) if m.split(".")[0] in ("engine", "server"))
            if bare:
                offenders[str(path.relative_to(ROOT))] = bare
    assert offenders == {}


def builds_a_parser(path: Path) -> bool:
    """Whether the module makes an argparse parser or adds options (taking a parsed Namespace is fine)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in (
            "ArgumentParser",
            "add_argument",
            "add_subparsers",
        ):
            return True
        if isinstance(node, ast.Name) and node.id == "ArgumentParser":
            return True
    return False


def test_parsers_live_in_the_command_line() -> None:
    offenders = []
    for folder in ("engine", "server"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = str(path.relative_to(ROOT))
            if builds_a_parser(path):
                offenders.append(rel)
    assert offenders == []
