"""`dfim trace`: the recorded frames, the HTML page, and the page rendered by headless Chromium."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from dfim.engine.api import FillRequest, Hole, SamplerSettings
from dfim.engine.inference.fill import Engine
from dfim.engine.inference.trace import Trace, build_html, record
from dfim.engine.model.checkpoint import write_random_checkpoint

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER = ROOT / "engine/weights/dfim-small/tokenizer.json"
CHROMIUM = Path("/usr/bin/chromium")
# A few steps keep the test fast on 2 busy cores; early_stop off so the step count is exact.
SETTINGS = SamplerSettings(max_steps=5, early_stop=False)
PIN = "return "


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    folder = write_random_checkpoint(tmp_path_factory.mktemp("tiny"), TOKENIZER)
    return Engine.load(folder)


@pytest.fixture(scope="module")
def trace(engine) -> Trace:
    """A skeleton fill: a pinned string, then an open hole."""
    request = FillRequest(
        prefix="def mean(values):\n    ", suffix="\n", middle=[PIN, Hole(8)], settings=SETTINGS, seed=3
    )
    return record(engine, request)


class ById(HTMLParser):
    """Text of the elements with an id, and the class of every span."""

    def __init__(self) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.span_classes: list[str] = []
        self._open: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span":
            self.span_classes.append(a.get("class") or "")
        if tag in ("br", "meta", "input", "link"):
            return
        self._open.append(a.get("id"))
        if a.get("id"):
            self.text.setdefault(a["id"], "")

    def handle_endtag(self, tag):
        if tag not in ("br", "meta", "input", "link") and self._open:
            self._open.pop()

    def handle_data(self, data):
        for element_id in self._open:
            if element_id:
                self.text[element_id] += data


def parse(page: str) -> ById:
    parser = ById()
    parser.feed(page)
    return parser


def embedded(page: str) -> dict:
    m = re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page, re.S)
    assert m, "no trace data in the page"
    return json.loads(m.group(1))


def dump_dom(page: Path, profile: Path) -> str:
    """The DOM headless Chromium has after loading `page` and running its scripts."""
    done = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def lf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")  # HTML parsing normalizes line ends


def test_frames_follow_the_fill(engine, trace):
    # The untrained model writes no EOS, so the open hole runs on into a second canvas (block 1).
    assert len(trace.frames) == trace.steps
    blocks = sorted({f.block for f in trace.frames})
    assert blocks == [0, 1]
    for block in blocks:
        assert [f.step for f in trace.frames if f.block == block] == list(range(1, SETTINGS.max_steps + 1))
    assert trace.fill.startswith(PIN)
    assert trace.frames[-1].text == trace.fill
    times = [f.ms for f in trace.frames]
    assert times == sorted(times) and times[0] > 0
    for f in trace.frames:
        assert len(f.confidence) == len(f.kept) == len(f.pinned) == len(f.special) == len(f.tokens)
        assert all(0.0 < c <= 1.0 for c in f.confidence)
        assert f.accepted == sum(f.kept)
    pin_ids = engine.tokenizer.encode(PIN)
    for f in trace.frames:
        if f.block == 0:
            assert f.pinned[: len(pin_ids)] == [True] * len(pin_ids) and not any(f.pinned[len(pin_ids) :])
            assert "".join(f.tokens[: len(pin_ids)]) == PIN
            assert all(f.kept[: len(pin_ids)])  # pins are never renoised
            assert f.text.startswith(PIN)
        else:
            assert not any(f.pinned)
    # uniform-state denoising renoises positions in the first step of an untrained model
    assert not all(trace.frames[0].kept)


def test_page_is_self_contained_and_carries_every_frame(trace):
    page = build_html(trace)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page), "the page loads something"
    assert "<link" not in page
    data = embedded(page)
    assert len(data["frames"]) == len(trace.frames)
    assert data["frames"][-1]["text"] == trace.fill
    assert data["frames"][0]["pinned"] == trace.frames[0].pinned
    assert lf(parse(page).text["final"]) == lf(trace.fill)


def test_text_cannot_break_out_of_the_page(trace):
    from dataclasses import replace

    nasty = "x = '</script><script>alert(1)</script><!--'"
    page = build_html(replace(trace, fill=nasty, prefix=nasty))
    assert page.count("</script>") == 2  # the data block's and the code's, nothing from the text
    assert embedded(page)["prefix"] == nasty
    assert parse(page).text["final"] == nasty


def test_cli_bad_input_is_one_line_and_status_2(tmp_path):
    def trace_cli(*argv):
        return subprocess.run(
            [sys.executable, "-m", "dfim.cli", "trace", *argv], capture_output=True, text=True, cwd=ROOT
        )

    source = tmp_path / "a.py"
    source.write_text("x = 1\n")
    for argv, message in [
        ([str(tmp_path / "missing.py"), "--line", "1", "--col", "1"], "no such file"),
        ([str(source), "--line", "9", "--col", "1"], "out of range"),
        ([str(source), "--line", "1", "--col", "1", "--out", str(tmp_path / "no/dir/t.html")], "no such"),
        ([str(source), "--line", "1", "--col", "1", "--steps", "0"], "--steps"),
        ([str(source), "--line", "1", "--col", "1", "--seed", str(2**64)], "--seed"),  # was a traceback
    ]:
        done = trace_cli(*argv)
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dfim trace: ") and message in lines[0]


def test_cli_traces_the_same_single_line_fill_as_dfim_fill(tmp_path):
    """After code on a line both commands stop at the newline, so the page shows what `dfim fill` prints."""
    spot = [
        str(ROOT / "fixtures" / "demo.py"),
        "--line",
        "8",
        "--col",
        "12",
        "--max-tokens",
        "16",
        "--seed",
        "3",
    ]
    run = lambda *argv: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "dfim.cli", *argv], capture_output=True, text=True, cwd=ROOT, check=True
    )
    printed = run("fill", *spot, "--candidates", "1").stdout  # a trace draws one canvas
    run("trace", *spot, "--out", str(tmp_path / "t.html"))
    page = (tmp_path / "t.html").read_text(encoding="utf-8")
    final = page.split('<pre id="final" class="code">', 1)[1].split("</pre>", 1)[0]
    assert html.unescape(final) == printed.rstrip("\n") and "\n" not in html.unescape(final)


def test_chromium_renders_the_final_frame(trace, tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not installed (clients/ci.sh installs it)")
    page = tmp_path / "trace.html"
    page.write_text(build_html(trace), encoding="utf-8")
    dom = parse(dump_dom(page, tmp_path / "profile"))
    # Written by the page's script (empty in the file itself): the script ran and opened on the last frame.
    assert lf(dom.text["frame-text"]) == lf(trace.fill)
    assert f"step {SETTINGS.max_steps}/{SETTINGS.max_steps}" in dom.text["label"]
    assert lf(dom.text["final"]) == lf(trace.fill)
    canvas_spans = [c for c in dom.span_classes if c.startswith("tok")]
    assert len(canvas_spans) >= len(trace.frames[-1].tokens)
    assert sum("pin" in c.split() for c in canvas_spans) == 1  # the legend's: the last canvas has no pins


def test_webview_page_keeps_user_text_literal_and_checks_the_nonce(trace):
    from dataclasses import replace

    tricky = "s = '@DATA@ @NONCE@ @FINAL@'"
    page = build_html(replace(trace, fill=tricky), nonce="n" * 22)
    assert parse(page).text["final"] == tricky  # one substitution pass: the slots in user text stay text
    assert " style=" not in page  # a strict style-src refuses style attributes
    with pytest.raises(ValueError):
        build_html(trace, nonce="'; script-src *")


def test_chromium_runs_the_nonce_page_under_its_strict_policy(trace, tmp_path):
    """The page an editor's webview gets (`dfim/lastTrace` with a nonce) still runs: its script and style carry
    the nonce and nothing else is inline."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not installed (clients/ci.sh installs it)")
    nonce = "Q2hyb21pdW1Ob25jZVRlc3Q"
    page = build_html(trace, nonce=nonce)
    assert f"script-src 'nonce-{nonce}'" in page and "unsafe-inline" not in page
    path = tmp_path / "webview.html"
    path.write_text(page, encoding="utf-8")
    dom = parse(dump_dom(path, tmp_path / "profile"))
    assert lf(dom.text["frame-text"]) == lf(trace.fill)  # written by the nonce'd script
    # the same page with a wrong nonce in its policy: the script is refused, the frame stays empty
    path.write_text(page.replace(f"'nonce-{nonce}'", "'nonce-somethingelse12345'"), encoding="utf-8")
    assert parse(dump_dom(path, tmp_path / "profile2")).text.get("frame-text", "") == ""


def test_recorder_keeps_only_the_last_frames_when_bounded():
    from dfim.engine.api import StepInfo
    from dfim.engine.inference.trace import Recorder

    def info(step: int, block: int = 0) -> StepInfo:
        return StepInfo(step, 9, 1, 1, 0.5, f"s{step}", block, [5], ["x"], [0.5], [True], [False])

    recorder = Recorder(eos_id=0, pad_id=1, max_frames=3)
    for step in range(1, 6):
        recorder.on_step(info(step))
    assert [f.step for f in recorder.frames] == [3, 4, 5] and recorder.dropped == 2
    recorder.on_step(info(1))  # step 1 of block 0 again: a retried fill starts over
    assert [f.step for f in recorder.frames] == [1] and recorder.dropped == 0
    recorder.on_step(info(0))  # a drafted fill retried: its draft (step 0) starts over too ...
    recorder.on_step(info(1))  # ... and its first step follows the draft
    recorder.on_step(info(2))
    assert [f.step for f in recorder.frames] == [0, 1, 2]


def top_left_pixel(png: bytes) -> tuple[int, int, int]:
    """RGB of pixel (0, 0): whatever the row filter, the first pixel of the first row is stored as is."""
    import struct
    import zlib

    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data = 8, b""
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        if kind == b"IDAT":
            data += png[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(data)
    return raw[1], raw[2], raw[3]  # raw[0] is the first row's filter type


@pytest.mark.parametrize("dark", [False, True])
def test_chromium_follows_the_dark_color_scheme(trace, tmp_path, dark):
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not installed (clients/ci.sh installs it)")
    page = tmp_path / "trace.html"
    page.write_text(build_html(trace), encoding="utf-8")
    shot = tmp_path / "shot.png"
    flags = ["--force-dark-mode", "--blink-settings=preferredColorScheme=0"] if dark else []
    done = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p'}",
         *flags, f"--screenshot={shot}", "--window-size=400,300", page.as_uri()],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    r, g, b = top_left_pixel(shot.read_bytes())
    if dark:
        assert max(r, g, b) < 80, (r, g, b)  # the page's dark background
    else:
        assert min(r, g, b) > 200, (r, g, b)


def test_page_shows_where_a_stop_string_cut_the_fill(trace):
    from dataclasses import replace

    from dfim.engine.inference.trace import build_html, text_after_stop

    assert text_after_stop("len(x)", "len(x)\n    return <y>", ("\n",)) == "\n    return <y>"
    assert text_after_stop("len(x)", "len(x)", ("\n",)) == ""  # nothing was cut
    assert text_after_stop("len(x)", "len(x) + 1", ("\n",)) == ""  # longer, but not at a stop string
    assert text_after_stop("len(x)", "len(x)\nz", ()) == ""
    assert 'id="cut"' not in build_html(trace)
    page = build_html(replace(trace, cut="\n    return <y>"))
    assert '<p id="cut"' in page and "<code>\\n    return &lt;y&gt;</code>" in page


@pytest.fixture(scope="module")
def healed(engine) -> Trace:
    """A fill whose prefix ends inside a word (`    ret`), early stop on: token healing and stop checks."""
    request = FillRequest(
        prefix="def mean(values):\n    ret", suffix="\n", settings=SamplerSettings(max_steps=4), seed=1
    )
    return record(engine, request)


def test_healed_prefix_is_drawn_once(healed):
    assert healed.heal and healed.prefix.endswith(healed.heal)  # " ret" or "ret", by the tokenizer
    assert healed.frames[0].tokens[0].startswith(healed.heal)  # the canvas's first token writes it
    shown = embedded(build_html(healed))["prefix"]
    assert shown == healed.prefix[: -len(healed.heal)]  # so the page draws it once, in the canvas


def test_frames_carry_what_the_stop_rules_measured(healed, trace):
    assert healed.stop_rule["confidence_threshold"] == SamplerSettings().confidence_threshold
    assert healed.stop_rule["early_stop"] == 1.0
    for frame in healed.frames:
        assert {"stable", "doubt", "end_settled"} <= frame.checks.keys()
        assert frame.checks["doubt"] >= 0.0
    assert trace.stop_rule["early_stop"] == 0.0  # the chain had no stop step to measure anything
    assert all(not frame.checks for frame in trace.frames)


def test_chromium_draws_line_breaks_and_the_stop_rule(healed, tmp_path):
    from dataclasses import replace

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not installed (clients/ci.sh installs it)")
    last = healed.frames[-1]
    tokens = ["\n"] + last.tokens[1:]  # a canvas whose first token is a bare line break
    page = tmp_path / "trace.html"
    page.write_text(
        build_html(replace(healed, frames=[replace(last, tokens=tokens, special=[""] * len(tokens))]))
    )
    dom = dump_dom(page, tmp_path / "profile")
    canvas = dom.split('id="canvas"', 1)[1].split("</div>", 1)[0]
    assert '<span class="nl">\u21b5</span>' in canvas
    rule = parse(dom).text["rule"]
    assert f"under {SamplerSettings().confidence_threshold}" in rule and "after 4 steps" in rule
