"""The wheel installs one importable name, `dfim`, and every package folder of the repository is in it."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
# The repository folders that install under `dfim` (pyproject's package-dir).
PACKAGE_ROOTS = {"dfim": ROOT / "dfim", "dfim.engine": ROOT / "engine", "dfim.server": ROOT / "server"}


def repository_packages() -> set[str]:
    """Every folder with an __init__.py under the three package roots, as a dotted name."""
    found = set()
    for name, folder in PACKAGE_ROOTS.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    return found


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    # dfim.engine and dfim.server are found through package-dir, so their subpackages must follow it
    assert config["package-dir"] == {"dfim": "dfim", "dfim.engine": "engine", "dfim.server": "server"}
    assert repository_packages() == listed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (found,) = out.glob("dfim-*.whl")
    return found


def test_wheel_has_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"dfim"}
    # the default model travels as package data, and only it (dfim-small stays in the checkout)
    assert any(n.startswith("dfim/engine/weights/dfim-base/") and n.endswith(".safetensors") for n in names)
    assert not any(n.startswith("dfim/engine/weights/dfim-small/") for n in names)
    size = sum(info.file_size for info in zipfile.ZipFile(wheel).infolist() if "/weights/" in info.filename)
    assert size <= 48 * 10**6  # the package's budget for model data
    assert "dfim/server/app.py" in names and "dfim/engine/inference/sampler.py" in names


def test_wheel_installs_only_dfim_into_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    before = {
        "pip",
        "setuptools",
        "_distutils_hack",
        "pkg_resources",
        "__pycache__",
        "distutils-precedence.pth",
    }
    installed = {p.name for p in Path(site).iterdir() if not p.name.endswith(".dist-info")} - before
    assert installed == {"dfim"}
    # the public types import without the dependencies (no torch in this venv); `engine` does not exist
    probe = "import dfim.engine.api, importlib.util; print(importlib.util.find_spec('engine'))"
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"
