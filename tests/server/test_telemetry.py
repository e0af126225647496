"""Unit tests of server/telemetry.py: the suggestion tracker, its events and their summary."""

from __future__ import annotations

import argparse
import json
import os
import stat

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


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_telemetry_is_0600_in_a_0700_folder_whatever_the_umask(tmp_path):
    previous = os.umask(0)  # the widest umask: only the modes given at creation hold
    try:
        t = telemetry.Telemetry(tmp_path / "new" / "dfim")
        t.record("shown", id="1")
    finally:
        os.umask(previous)
    assert _mode(t.directory) == 0o700 and _mode(t.path) == 0o600


def test_an_existing_world_readable_folder_and_files_are_tightened(tmp_path):
    folder = tmp_path / "dfim"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    (folder / "telemetry.jsonl").write_text("")
    (folder / "telemetry.jsonl.1").write_text("")
    os.chmod(folder / "telemetry.jsonl", 0o644)
    os.chmod(folder / "telemetry.jsonl.1", 0o644)
    t = telemetry.Telemetry(folder)
    t.record("shown", id="1")
    assert _mode(folder) == 0o700
    assert _mode(folder / "telemetry.jsonl") == 0o600 and _mode(folder / "telemetry.jsonl.1") == 0o600


def test_a_symlink_in_place_of_the_file_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "dfim").mkdir()
    (tmp_path / "dfim" / "telemetry.jsonl").symlink_to(target)
    failures = []
    telemetry.Telemetry(tmp_path / "dfim", on_failure=failures.append).record("shown", id="1")
    assert target.read_text() == "" and len(failures) == 1


def test_a_write_failure_is_shown_to_the_user_once_per_session(tmp_path, monkeypatch):
    from lsprotocol import types

    from dfim.server.app import DfimServer

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DFIM_DATA_DIR", str(blocker / "dfim"))  # cannot be created: like a full disk
    server = DfimServer()
    shown = []
    monkeypatch.setattr(server, "window_show_message", shown.append)
    server.tracker.shown(telemetry.Shown("1", "u", "abc", "python"), latencyMs=1.0, source="model")
    server.tracker.accepted("1")
    # new settings make a new Telemetry: the failure is still said once per session
    assert server.apply_settings({"telemetry": {"enabled": True}}, "test") == []
    server.tracker.shown(telemetry.Shown("2", "u", "abc", "python"), latencyMs=1.0, source="model")
    assert len(shown) == 1
    assert shown[0].type == types.MessageType.Warning and "cannot write" in shown[0].message
    assert "a-file" in shown[0].message


def test_a_failing_report_does_not_break_the_record(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")

    def broken(message):
        raise RuntimeError("no client")

    t = telemetry.Telemetry(blocker / "dir", on_failure=broken)
    t.record("shown", id="1")  # never raises
    assert t.failed


def test_accepting_a_cycled_candidate_counts_it_shown_and_accepted(tmp_path):
    t = telemetry.Telemetry(tmp_path)
    tracker = telemetry.SuggestionTracker(t)
    tracker.shown(telemetry.Shown("first", "u", "abc", "python"), latencyMs=10.0, source="model")
    tracker.alternative(telemetry.Shown("second", "u", "xyz", "python"))
    tracker.alternative(telemetry.Shown("third", "u", "qrs", "python"))
    tracker.accepted("second")  # the user cycled once and took it
    tracker.accepted("third")  # a stale command of an answer already decided: nothing
    events = [(e["event"], e.get("id")) for e in telemetry.read_events(t.path)]
    assert events == [("shown", "first"), ("rejected", "first"), ("shown", "second"), ("accepted", "second")]
    assert [e.get("source") for e in telemetry.read_events(t.path) if e["event"] == "shown"] == [
        "model",
        "cycled",
    ]


def test_a_suggestion_held_for_the_model_load_stays_out_of_the_latencies(tmp_path, capsys):
    t = telemetry.Telemetry(tmp_path)
    tracker = telemetry.SuggestionTracker(t)
    tracker.shown(
        telemetry.Shown("1", "u", "abc", "python"), latencyMs=7400.0, source="model", heldForModel=True
    )
    tracker.shown(telemetry.Shown("2", "u", "xyz", "python"), latencyMs=90.0, source="model")
    summary = telemetry.summarize(telemetry.read_events(t.path))
    assert summary["shown"] == 2 and summary["held_for_model"] == 1
    assert summary["latency_n"] == 1 and summary["latency_p90"] == 90.0
    from dfim.commands import stats

    assert stats.run(argparse.Namespace(data_dir=str(tmp_path), json=False)) == 0
    assert "1 shown after waiting for the model to load" in capsys.readouterr().out
