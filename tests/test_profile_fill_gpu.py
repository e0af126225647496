"""scripts/profile_fill_gpu.py on the CPU with a tiny random shape: every section runs and reports.

The GPU run differs in the shape (26B-A4B), the device and the fast path with its graphs; its numbers are not
checked here, only that each measurement ran and the typing section encoded what was typed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "profile_fill_gpu.py"


def test_every_section_runs_and_typing_encodes_only_what_was_typed(tmp_path: Path) -> None:
    out = tmp_path / "profile.txt"
    command = [sys.executable, str(SCRIPT), "--shape", "tiny", "--device", "cpu", "--fills", "2"]
    proc = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = out.read_text()
    assert "'device': 'cpu'" in report and "fill: " in report
    for section in ("with the trace recorder", "without it", "decoder passes alone", "plain encoder,    3"):
        assert section in report
    typed = re.search(r"tokens encoded \[([0-9, ]+)\]", report)
    assert typed is not None
    encoded = [int(n) for n in typed.group(1).split(",")]
    assert 0 < encoded[0] <= 4 and all(n <= 4 for n in encoded)  # three characters: a few tokens, never all
    assert "torch.profiler, 3 fills" in report and "cProfile, 3 fills" in report
