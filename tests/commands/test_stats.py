"""`dfim stats`: counts that add up, and the number of samples beside every percentile (issue 35)."""

from __future__ import annotations

import argparse
import json

from dfim.commands import stats


def events(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def run_stats(tmp_path, capsys, *extra: str) -> str:
    parser = argparse.ArgumentParser()
    stats.add_arguments(parser)
    assert stats.run(parser.parse_args(["--data-dir", str(tmp_path), *extra])) == 0
    return capsys.readouterr().out


def test_counts_add_up_and_percentiles_carry_n(tmp_path, capsys):
    # 4 shown: 1 accepted, 2 rejected, 1 left without an outcome (the "4 = 1 + 2")
    (tmp_path / "telemetry.jsonl").write_text(
        events(
            *({"event": "shown", "id": i, "latencyMs": 10.0 * (n + 1)} for n, i in enumerate("abcd")),
            {"event": "accepted", "id": "a", "acceptedChars": 3},
            {"event": "rejected", "id": "b"},
            {"event": "rejected", "id": "c"},
        )
    )
    out = run_stats(tmp_path, capsys)
    assert "shown 4 = accepted 1 + partial 0 + rejected 2 + no outcome 1" in out
    latency_lines = [line for line in out.splitlines() if line.startswith("latency")]
    assert len(latency_lines) == 2 and all("n=4" in line for line in latency_lines)
    assert "fewer than 20 samples" in latency_lines[0]
    summary = json.loads(run_stats(tmp_path, capsys, "--json"))
    assert summary["no_outcome"] == 1 and summary["latency_n"] == summary["model_latency_n"] == 4
    assert summary["shown"] == (
        summary["accepted"] + summary["partial"] + summary["rejected"] + summary["no_outcome"]
    )
