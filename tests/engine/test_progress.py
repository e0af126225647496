"""engine/progress.py: a live bar on a terminal, a few distinct plain lines in a log (issue 35)."""

from __future__ import annotations

import io

from dfim.engine.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_tenth_and_no_duplicates():
    log = io.StringIO()
    progress = Progress(200, "filling", unit="fills", stream=log)
    for _ in range(200):
        progress.update(1, "cfg")
    for _ in range(34):  # the old bar wrote "200/200" once per call after the end
        progress.update(0)
    progress.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert len(lines) == len(set(lines)) == 11  # 0, 20, ..., 200
    assert lines[0].startswith("filling: 0/200 fills (0%)")
    assert lines[-1].startswith("filling: 200/200 fills (100%)")
    assert "ETA" in lines[5] and "ETA" not in lines[-1]


def test_a_log_gets_a_line_after_the_interval_even_between_tenths():
    log = io.StringIO()
    progress = Progress(1000, "testing", stream=log, interval=0.0)
    for _ in range(5):
        progress.update(1)
    progress.update(0)  # no new count: no new line
    assert len(log.getvalue().splitlines()) == 6


def test_close_writes_the_last_count_once():
    log = io.StringIO()
    progress = Progress(100, "scoring", stream=log)
    progress.update(7)
    progress.close()
    progress.close()
    assert log.getvalue().splitlines()[-1].startswith("scoring: 7/100")
    assert len(log.getvalue().splitlines()) == 2


def test_a_terminal_gets_a_tqdm_bar():
    term = Terminal()
    with Progress(10, "filling", stream=term) as progress:
        for _ in range(10):
            progress.update(1, "pass 50.0%")
    assert "\r" in term.getvalue() and "10/10" in term.getvalue()


def test_disabled_and_empty_progress_write_nothing():
    log = io.StringIO()
    Progress(10, "x", stream=log, enabled=False).update(3)
    Progress(0, "x", stream=log).close()
    assert log.getvalue() == ""


def test_a_phase_closed_early_says_why_without_an_eta():
    import io

    from dfim.engine.progress import Progress

    stream = io.StringIO()
    bar = Progress(48, "fill", unit="steps", stream=stream, interval=1e9)
    bar.update(24, "18/64 settled")
    bar.close("18/64 settled; stopped after 24 of 48 steps")
    last = stream.getvalue().strip().split("\n")[-1]
    assert last.startswith("fill: 24/48 steps") and last.endswith("stopped after 24 of 48 steps")
    assert "ETA" not in last
