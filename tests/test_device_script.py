"""scripts/train_base_on_device.sh on CPU: its stages up to torchrun (DRY_RUN=1), run twice each."""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train_base_on_device.sh"


def stage(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_scripts_parse() -> None:
    for name in ("train_base_on_device.sh", "train_base_pipeline.sh", "device_env.sh", "device_prelude.sh"):
        subprocess.run(["bash", "-n", str(REPO / "scripts" / name)], check=True)


def carry_go_shard(tmp_path: Path) -> Path:
    carried = tmp_path / "carried"
    carried.mkdir()
    go = (REPO / "fixtures" / "example.go").read_text()
    with lzma.open(carried / "train-00.jsonl.xz", "wb") as f:
        for lic in ("MIT", "GPL-3.0-only"):
            row = {
                "text": go + f"// {lic}\n",
                "path": f"{lic}/main.go",
                "lang": "go",
                "license": lic,
                "source": "t",
            }
            f.write((json.dumps(row) + "\n").encode())
    return carried


def wait_for(path: Path, text: str) -> str:
    for _ in range(100):  # the background pipeline ends right after printing its commands
        if path.is_file() and text in path.read_text():
            break
        time.sleep(0.2)
    return path.read_text()


def dry_run_env(tmp_path: Path, py_roots: Path, path_first: str = "") -> dict[str, str]:
    """The stages' environment for a dry run under tmp_path, with the carried Go shard."""
    return {
        **os.environ,
        # python3 with dfim's dependencies, as on the GPU machine (where dfim itself is not installed).
        "PATH": f"{path_first}{Path(sys.executable).parent}:{os.environ['PATH']}",
        "DFIM_ROOT": str(tmp_path / "root"),
        "CARRIED": str(carry_go_shard(tmp_path)),
        "TOKENIZER_SRC": "engine/weights/dfim-small/tokenizer.json",
        "DRY_RUN": "1",
        "PY_ROOTS": str(py_roots),
        "HEADER_ROOTS": "",
        "START_WAIT": "120",
        "FIRST_LINES_WAIT": "0",
    }


def test_dry_run_stages(tmp_path: Path) -> None:
    pyroot = tmp_path / "py"
    pyroot.mkdir()
    (pyroot / "area.py").write_text("def area(r):\n    return 3.14159 * r * r\n")
    env = dry_run_env(tmp_path, pyroot)
    assert "copied" in stage(env, "unpack")
    assert "there already" in stage(env, "unpack")
    started = stage(env, "start")
    assert "pipeline started" in started
    run = tmp_path / "root" / "run"
    log = wait_for(run / "pipeline.log", "pipeline finished")
    assert "--objective causal" in log and "--causal-weight 1.0" in log and "--init-from" in log
    assert "--model-config base" in log and "DRY_RUN: not started" in log
    summary = json.loads((run / "data_summary.json").read_text())
    assert summary["languages"].keys() == {"go"}  # the .py file has no licence, the GPL record is dropped
    assert summary["dropped"]["license_not_permissive"] == 2
    settings = (run / "settings.env").read_text()
    deadline = [line for line in settings.splitlines() if line.startswith("DEADLINE=")]
    assert len(deadline) == 1
    # Again: the shards are not rebuilt and the deadline stays the first one.
    stage(env, "start")
    for _ in range(100):
        if (
            "already built" in (run / "data.log").read_text()
            and "pipeline finished" in (run / "pipeline.log").read_text()
        ):
            break
        time.sleep(0.2)
    assert "already built" in (run / "data.log").read_text()
    assert [
        line for line in (run / "settings.env").read_text().splitlines() if line.startswith("DEADLINE=")
    ] == deadline
    out = tmp_path / "out"
    out.mkdir()
    stage({**env, "OUT": str(out), "FETCH_MANIFEST": "1"}, "fetch")
    with tarfile.open(out / "logs.tgz") as logs:
        assert "data_summary.json" in logs.getnames()
    assert (out / "data_manifest.jsonl.gz.part00").is_file()
    # `wait` on an ended run fetches in the same call: the machine may be gone before another call comes.
    waited = tmp_path / "waited"
    waited.mkdir()
    assert "the run has ended" in stage({**env, "OUT": str(waited)}, "wait", "1")
    with tarfile.open(waited / "logs.tgz") as logs:
        assert "pipeline.log" in logs.getnames()


def test_dry_run_side_by_side(tmp_path: Path) -> None:
    """EXTRA_TRAIN_ARGS_B on a 4-GPU machine: two diffusion runs of 2 processes each, B with its flags."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"  # what the pipeline asks of the driver: the GPU list and their memory
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = -L ]; then for i in 0 1 2 3; do echo "GPU $i: H200"; done; '
        "else echo 143771; fi\n"
    )
    fake.chmod(0o755)
    env = {
        **dry_run_env(tmp_path, tmp_path, path_first=f"{bin_dir}:"),
        "INIT_FROM": str(REPO / "engine" / "weights" / "dfim-small"),
        "EXTRA_TRAIN_ARGS": "--lr 3e-4",
        "EXTRA_TRAIN_ARGS_B": "--cross-file-p 0.3",
    }
    stage(env, "unpack")
    stage(env, "start")
    log = wait_for(tmp_path / "root" / "run" / "pipeline.log", "pipeline finished")
    runs = [line for line in log.splitlines() if "run: torchrun" in line]
    assert len(runs) == 2, log
    a, b = sorted(runs, key=lambda line: "/diffb" in line)
    assert all("--nproc_per_node=2" in line and "--lr 3e-4" in line for line in runs)
    assert "--out" in a and "/run/diff " in a and "--cross-file-p" not in a
    assert "/run/diffb " in b and b.endswith(
        "--cross-file-p 0.3 > " + str(tmp_path / "root" / "run" / "diffb.log")
    )
    assert "--objective causal" not in log  # continuing INIT_FROM: no AR phase
