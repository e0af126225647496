"""Unit tests of server/telemetry.py: the suggestion tracker, its events and their summary."""

from __future__ import annotations

import argparse
import json

import pytest

from dfim.server import options, telemetry


def test_tracker_and_stats(tmp_path, capsys):
    t = telemetry.Telemetry(tmp_path)
    tracker = telemetry.SuggestionTracker(t)
    tracker.shown(telemetry.Shown("1", "u", "abcdef", "python"), latencyMs=100.0, source="model")
    tracker.accepted("1")
    tracker.shown(telemetry.Shown("2", "u", "xyz", "python"), latencyMs=200.0, source="model")
    tracker.shown(telemetry.Shown("3", "u", "hello", "python"), latencyMs=50.0, source="cache")  # 2 rejected
    tracker.typed("u", 2)
    tracker.supersede("u")  # 3 partially accepted (typed 2 chars, then moved on)
    events = telemetry.read_events(t.path)
    assert [e["event"] for e in events] == ["shown", "accepted", "shown", "rejected", "shown", "partial"]
    summary = telemetry.summarize(events)
    assert summary["acceptance_rate"] == pytest.approx(1 / 3)
    assert summary["latency_p50"] == 100.0 and summary["model_latency_p95"] == 200.0
    assert summary["accepted_chars"] == 8
    from dfim.commands import stats

    assert stats.run(argparse.Namespace(data_dir=str(tmp_path), json=True)) == 0
    assert json.loads(capsys.readouterr().out)["shown"] == 3
    disabled = telemetry.Telemetry(tmp_path / "off", enabled=False)
    disabled.record("shown", id="x")
    assert not disabled.path.exists()


def test_percentile():
    assert telemetry.percentile([5, 1, 3, 2, 4], 50) == 3
    assert telemetry.percentile([1.0], 95) == 1.0


def test_a_partial_accept_can_grow_to_an_accept(tmp_path):
    t = telemetry.Telemetry(tmp_path)
    tracker = telemetry.SuggestionTracker(t)
    # VS Code: the watcher sees the whole insert first ("partial"), then the item's accept command runs
    tracker.shown(telemetry.Shown("1", "u", "abcdef", "python"), latencyMs=10.0, source="model")
    tracker.partially_accepted("1", 6)
    tracker.accepted("1")
    # accept word, accept word, then moved on
    tracker.shown(telemetry.Shown("2", "u", "one two three", "python"), latencyMs=10.0, source="model")
    tracker.partially_accepted("2", 4)
    tracker.partially_accepted("2", 8)
    tracker.partially_accepted("2", 4)  # a stale, smaller report changes nothing
    tracker.rejected("2")  # dismissing the rest keeps what was taken
    tracker.shown(telemetry.Shown("3", "u", "xyz", "python"), latencyMs=10.0, source="model")
    events = telemetry.read_events(t.path)
    assert [(e["event"], e.get("acceptedChars")) for e in events if e["event"] != "shown"] == [
        ("accepted", 6),
        ("partial", 4),
        ("partial", 8),
    ]
    summary = telemetry.summarize(events)
    assert (summary["shown"], summary["accepted"], summary["partial"], summary["rejected"]) == (3, 1, 1, 0)
    assert summary["accepted_chars"] == 6 + 8


def test_a_relative_telemetry_dir_is_refused_and_an_unwritable_one_is_named(tmp_path, caplog):
    merged, errors = options.merge_options(options.Options(), {"telemetry": {"dataDir": "rel/dir"}})
    assert merged.telemetry.data_dir == "" and "absolute path" in errors[0]  # not the user's project
    merged, errors = options.merge_options(options.Options(), {"telemetry": {"dataDir": "~/dfim-data"}})
    assert merged.telemetry.data_dir == "~/dfim-data" and errors == []
    assert telemetry.Telemetry(tmp_path / "new").problem() is None
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    broken = telemetry.Telemetry(blocker / "dir")
    assert "cannot be written" in broken.problem()
    with caplog.at_level("WARNING", logger="dfim.server"):
        broken.record("shown", id="1")
        broken.record("shown", id="2")
    assert len([r for r in caplog.records if "telemetry" in r.getMessage()]) == 1  # said once, never raised
