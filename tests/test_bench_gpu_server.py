"""scripts/bench_gpu_server.py on the CPU with its tiny shape: the real `dfim serve`, every phase, the exit code.

The GPU run differs only in the shape (26B-A4B), the device and the dtype the weights are made in; its
numbers are not checked here, only that every phase ran through the server and reported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_gpu_server.py"


def bench(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--shape", "tiny", "--device", "cpu", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=240)


def test_every_phase_runs_through_the_real_server(tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    proc = bench(tmp_path, "--requests", "3", "--candidates", "1", "--blocks", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = out.read_text()
    assert report == proc.stdout  # the file holds the whole report
    assert "no weight files" in report and '"random_init": {"seed": 0' in report
    assert "ready after" in report and "random-tiny on cpu" in report
    # warm-up and timed passes, at line ends and while typing: every request one fill
    assert report.count("round trip      p50") == 4
    assert report.count("3 fills for 3 requests") == 4
    assert "engine ms per decoder pass" in report
    assert "block fill round trip: p50" in report and "48 steps (max_steps)" in report
    # where fills ran, from dfim/stats: the plain network on the CPU in fp32
    path = json.loads(report.split("engine path: ", 1)[1].splitlines()[0])
    assert path == {
        "device": "cpu",
        "dtype": "float32",
        "fast": False,
        "fast_path": None,
        "sampler": "torch",
        "cpu_products": "fp32",
    }
    assert '"failed": 0' in report and report.rstrip().splitlines()[-1].startswith("OK after")


def test_a_server_without_a_model_fails_the_run(tmp_path: Path) -> None:
    missing = json.dumps({"model": {"path": str(tmp_path / "missing")}})
    proc = bench(tmp_path, "--settings", missing)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: no model" in proc.stdout and "checkpoint folder not found" in proc.stdout
