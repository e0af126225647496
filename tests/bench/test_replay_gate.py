"""`dfim replay`'s gate accounting (dfim/bench/replay_gate.py): which confidence each shown suggestion is
judged by, and the with/without rows."""

from __future__ import annotations

import math

import pytest

from dfim.bench.replay import RegionStats, ReplayOptions, RequestRecord
from dfim.bench.replay_gate import gate_summary, shown_suggestions


def record(verdict: str, p: float | None, chars: int = 0, shown: str = "x") -> RequestRecord:
    confidence = None
    if p is not None:
        lp = math.log(p)
        confidence = {"tokens": 2, "meanLogprob": lp, "minLogprob": lp, "meanEntropy": 0.1, "maxEntropy": 0.2}
    r = RequestRecord(0, 0, 0, 1.0, None, "" if verdict == "none" else shown, verdict, chars)
    r.confidence, r.gate_score = confidence, p
    return r


def test_a_typed_ahead_continuation_is_judged_with_the_suggestion_it_continues():
    log = [
        record("partial", 0.2, 4),  # unsure, partly taken
        record("rejected", None),  # the rest of it, served typed-ahead: no fill, no verdict
        record("full", 0.9, 6),
        record("none", 0.5),  # nothing shown
        record("rejected", None),  # typed-ahead after a request that showed nothing: the last judged one
    ]
    rows = shown_suggestions(log)
    assert [(c and round(math.exp(c["meanLogprob"]), 3), ok, n) for c, ok, n in rows] == [
        (0.2, True, 4),
        (0.2, False, 0),
        (0.9, True, 6),
        (0.5, False, 0),
    ]


def test_gate_rows_from_one_ungated_run():
    region = RegionStats(source="x", chars=20)
    region.request_log = [record("partial", 0.2, 4), record("rejected", None), record("full", 0.9, 6)]
    region.request_log += [record("rejected", 0.1), record("rejected", 0.6)]
    summary = gate_summary([region], ReplayOptions(gate_threshold=0.5))
    without, gated = summary["without"], summary["with"]
    assert (without["shown"], without["accepted"], without["accepted_chars"]) == (5, 2, 10)
    assert without["reward"] == pytest.approx(2 * 0.75 - 3 * 0.25)
    assert without["chars_saved"] == pytest.approx(0.5)
    # the gate hides the 0.2 suggestion and its continuation, and the 0.1 one
    assert (gated["shown"], gated["accepted"], gated["accepted_chars"]) == (2, 1, 6)
    assert gated["reward"] == pytest.approx(0.5) and gated["chars_saved"] == pytest.approx(0.3)
    live = gate_summary([region], ReplayOptions(gate_live=True))
    assert live["without"] is None and live["with"]["shown"] == 5
