"""`dfim stats`: counts that add up, and the number of samples beside every percentile (issue 35)."""

from __future__ import annotations

import argparse
import json
import math
import os
import threading

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


def test_stats_survives_any_line(tmp_path, capsys):
    good = {"event": "shown", "id": "a", "latencyMs": 10.0}
    text = (
        events(good)
        + '{"event": "shown", "id": "b", "latencyMs": 1'
        + "0" * 400
        + "}\n"  # 10**400: OverflowError in float()
        + '{"event": "accepted", "id": "b", "acceptedChars": 1'
        + "0" * 400
        + "}\n"  # skipped, not counted
        + events({"event": "accepted", "id": "a", "acceptedChars": 2})
        + '{"event": "shown", "id": "c", "latencyMs": 1'
        + "0" * 5000
        + "}\n"  # past Python's int digit limit
        + '{"event": "shown", "id": "d", "x": '
        + "[" * 100_000
        + "]" * 100_000
        + "}\n"  # RecursionError
        + "[" * 100_000
        + "\n"
        + events(
            {"event": "shown", "id": "e", "latencyMs": "12"},
            {"event": "shown", "id": "f", "latencyMs": [1]},
            {"event": {"nested": 1}, "id": "g"},
            {"event": "partial", "id": 5, "acceptedChars": "x"},
        )
        + "\x00 garbage \ud800\n{]\n1e999\nnull\n"
    )
    (tmp_path / "telemetry.jsonl").write_bytes(
        text.encode("utf-8", "surrogatepass") + b"\xff\xfe not UTF-8\n"
    )
    summary = json.loads(run_stats(tmp_path, capsys, "--json"))
    assert summary["latency_n"] == 1 and summary["latency_p50"] == 10.0
    # shown: a, b (its latency is dropped), e and f (theirs are not numbers); c, d and g are skipped
    assert summary["shown"] == 4 and summary["accepted"] == 1 and summary["accepted_chars"] == 2
    assert "shown 4 = accepted 1" in run_stats(tmp_path, capsys)


def refused(tmp_path, capsys) -> str:
    parser = argparse.ArgumentParser()
    stats.add_arguments(parser)
    assert stats.run(parser.parse_args(["--data-dir", str(tmp_path)])) not in (0, 1)
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    return err


def test_stats_refuses_a_fifo_without_hanging(tmp_path, capsys):
    os.mkfifo(tmp_path / "telemetry.jsonl")
    done = []
    thread = threading.Thread(target=lambda: done.append(refused(tmp_path, capsys)), daemon=True)
    thread.start()
    thread.join(10)
    if not done:  # the old code waits for a writer forever: give it one, so the test ends
        with open(tmp_path / "telemetry.jsonl", "w"):
            pass
        thread.join(10)
        raise AssertionError("dfim stats hung on a FIFO")
    assert "not a regular file" in done[0]


def test_stats_refuses_a_folder_or_device_in_place_of_the_file(tmp_path, capsys):
    (tmp_path / "telemetry.jsonl").mkdir()
    assert "not a regular file" in refused(tmp_path, capsys)
    (tmp_path / "telemetry.jsonl").rmdir()
    (tmp_path / "telemetry.jsonl.1").symlink_to("/dev/zero")  # would be read forever
    assert "not a regular file" in refused(tmp_path, capsys)


def test_stats_report_the_gate_as_shown_and_gated(tmp_path, capsys):
    """Issue 33: shown, acceptance of those shown, characters saved and reward, as shown and with the gate;
    a suggestion the gate hid is counted but has no outcome."""

    def shown(key: str, p: float) -> dict:
        summary = {"tokens": 3, "meanLogprob": math.log(p), "minLogprob": math.log(p) - 1.0}
        summary.update(meanEntropy=0.1, maxEntropy=0.5)
        return {"event": "shown", "id": key, "latencyMs": 5.0, "gateScore": p, "confidence": summary}

    (tmp_path / "telemetry.jsonl").write_text(
        events(
            shown("a", 0.9),
            shown("b", 0.1),
            shown("c", 0.5),
            shown("d", 0.05),  # still on screen: no outcome, left out
            {"event": "shown", "id": "e", "latencyMs": 5.0},  # from before the gate: never gated
            {"event": "hidden", "language": "python", "chars": 9, "gateScore": 0.01},
            {"event": "partial", "id": "a", "acceptedChars": 2},
            {"event": "accepted", "id": "a", "acceptedChars": 6},  # the last outcome counts
            {"event": "rejected", "id": "b"},
            {"event": "partial", "id": "c", "acceptedChars": 3},
            {"event": "rejected", "id": "e"},
        )
    )
    mean = ("--gate-measure", "mean_probability")
    report = json.loads(run_stats(tmp_path, capsys, "--json", *mean, "--gate-threshold", "0.3"))["gate"]
    assert report["hidden"] == 1 and report["threshold"] == 0.3
    assert report["as_shown"] == {
        "shown": 4, "accepted": 2, "acceptance_rate": 0.5, "accepted_chars": 9, "reward": 1.0,
    }  # fmt: skip
    gated = report["gated"]  # b (0.1) is gone; e has no score, so the gate has nothing to judge
    assert (gated["shown"], gated["accepted"], gated["accepted_chars"]) == (3, 2, 9)
    assert gated["reward"] == 1.25
    # another measure reads the recorded summary again: min p of a is 0.9/e, of c 0.5/e < 0.3
    strict = json.loads(run_stats(tmp_path, capsys, "--json", "--gate-measure", "min_probability",
                                  "--gate-threshold", "0.3"))["gate"]["gated"]  # fmt: skip
    assert (strict["shown"], strict["accepted"]) == (2, 1)
    out = run_stats(tmp_path, capsys, *mean, "--gate-threshold", "0.3")
    assert "as shown: shown 4, accepted 2 (50.0% of shown), characters saved 9, reward 1.00" in out
    assert "gated (mean_probability >= 0.3): shown 3" in out and "the gate hid 1 suggestions" in out
