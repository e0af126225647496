"""The chains pass correct answers through whole: `scripts/postprocess_oracle.py` on the fixture project,
where every line, several-line fill, hole and function-body completion that the model could get right
must reach the document as it was (no model runs; each answer is fed as if the model had written it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_correct_answers_come_through_the_chains_whole(tmp_path):
    out = tmp_path / "oracle.json"
    kinds = "line,line@col0,line-closed,ml-eol,ml-blank,ml-mid,fh-hole,cf-blank"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "postprocess_oracle.py"), "--source",
         str(ROOT / "fixtures" / "realcode" / "project"), "--glob", "**/*.py", "--language", "python",
         "--limit", "40", "--kinds", kinds, "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    for kind in kinds.split(","):
        spots, counts = report[kind]["spots"], report[kind]["counts"]
        assert spots >= 10, kind
        assert counts.get("ok", 0) == spots, (kind, counts, report[kind]["examples"])
