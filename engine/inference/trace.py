"""Record one fill step by step and render it as a self-contained HTML replay (`dfim trace`, `dfim/lastTrace`).

The page (inline CSS and JS, no network) shows, per denoising step, the canvas read as its argmax tokens:
each token shaded by its confidence exp(-entropy), renoised positions struck through, pins outlined, line
breaks drawn as a visible mark, with the step number, the time since the fill started and what the stop
rules measured (so a reader sees why the fill went on); a slider and a play button walk the steps. It opens
on the last frame, and the committed fill is always in the page as `<pre id="final">`. Where token healing
backed characters off the prefix, the context shown ends before them: the canvas's first token writes them.
"""

from __future__ import annotations

import html
import json
import re
import time
from dataclasses import asdict, dataclass, field, replace

from dfim.engine.api import FillRequest, FillResult, StepInfo

# How much context the page shows around the canvas: enough to see where the fill goes.
CONTEXT_LINES = 6


@dataclass
class Frame:
    """One denoising step of row 0 (the only row when candidates == 1), or the draft it started from."""

    step: int  # 1-based within its block; 0: the encoder's draft
    max_steps: int
    block: int
    ms: float  # since the fill started (context encoding included)
    accepted: int  # positions kept this step (pins included)
    mean_entropy: float
    text: str  # what the fill reads now: the earlier blocks' text + this canvas' argmax text
    tokens: list[str]  # per canvas position
    special: list[str]  # per position: "" for text, "eos" or "pad" for the end markers
    confidence: list[float]
    kept: list[bool]  # accepted this step; False: renoised
    pinned: list[bool]
    checks: dict[str, float] = field(default_factory=dict)  # StepInfo.checks: what the stop rules measured


@dataclass
class Trace:
    prefix: str
    suffix: str
    fill: str  # the committed fill (FillResult.text)
    steps: int
    stop_reason: str
    latency_ms: float
    model: str
    random_model: bool
    frames: list[Frame] = field(default_factory=list)
    # What the last canvas read after the committed fill when a stop string (a single-line fill's
    # newline) ended it there: shown under the fill, so the page explains why the canvas says more.
    cut: str = ""
    heal: str = ""  # token healing: the prefix's tail that the canvas's first token re-writes
    # The stop rules' settings (SamplerSettings): early_stop, stability_threshold, confidence_threshold, max_steps.
    stop_rule: dict[str, float] = field(default_factory=dict)


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def text_after_stop(fill: str, canvas_text: str, stop: tuple[str, ...]) -> str:
    """The part of `canvas_text` that `stop` cut off `fill` ("" when nothing was cut)."""
    if not stop or not canvas_text.startswith(fill) or len(canvas_text) == len(fill):
        return ""
    rest = canvas_text[len(fill) :]
    return rest if any(rest.startswith(s) for s in stop) else ""


class Recorder:
    """Collects the frames of one fill from its StepInfo reports (on whichever thread the engine runs).

    `on_step` goes into the request; `trace` turns the frames and the fill's result into a Trace. A report of
    block 0 that does not come after the last frame (its step again or an earlier one, or block 0 after a later
    block) starts over: the fill was retried (out of memory). With
    `max_frames`, only the last that many steps are kept (`dropped` counts the others): a bound on memory.
    """

    def __init__(self, eos_id: int, pad_id: int, max_frames: int | None = None) -> None:
        self.eos_id, self.pad_id = eos_id, pad_id
        self.max_frames = max_frames
        self.dropped = 0
        self.frames: list[Frame] = []
        self._done_text: list[str] = []  # text of finished blocks
        self.heal = ""
        self._start = time.perf_counter()

    def on_step(self, info: StepInfo) -> None:
        frames = self.frames
        if frames and info.block == 0 and (frames[-1].block != 0 or info.step <= frames[-1].step):
            frames.clear()
            self._done_text.clear()
            self.dropped = 0
        if info.block == 0 and info.heal:
            self.heal = info.heal
        if frames and info.block != frames[-1].block:
            self._done_text.append(frames[-1].text[len("".join(self._done_text)) :])
        special = ["eos" if t == self.eos_id else "pad" if t == self.pad_id else "" for t in info.token_ids]
        frames.append(
            Frame(
                step=info.step,
                max_steps=info.max_steps,
                block=info.block,
                ms=(time.perf_counter() - self._start) * 1000.0,
                accepted=info.accepted,
                mean_entropy=info.mean_entropy,
                text="".join(self._done_text) + info.argmax_text,
                tokens=list(info.tokens),
                special=special,
                confidence=[round(c, 4) for c in info.confidence],
                kept=list(info.accepted_mask),
                pinned=list(info.pinned),
                checks={name: round(value, 5) for name, value in info.checks.items()},
            )
        )
        if self.max_frames is not None and len(frames) > self.max_frames:
            del frames[: len(frames) - self.max_frames]
            self.dropped += 1

    def trace(self, request: FillRequest, result: FillResult, model: str, random_model: bool) -> Trace:
        return Trace(
            prefix=request.prefix,
            suffix=request.suffix,
            fill=result.text,
            steps=result.steps,
            stop_reason=result.stop_reason,
            latency_ms=result.latency_ms,
            model=model,
            random_model=random_model,
            frames=self.frames,
            cut=text_after_stop(result.text, self.frames[-1].text, request.stop) if self.frames else "",
            heal=self.heal,
            stop_rule={
                "early_stop": float(request.settings.early_stop),
                "stability_threshold": float(request.settings.stability_threshold),
                "confidence_threshold": float(request.settings.confidence_threshold),
                "max_steps": float(request.settings.max_steps),
            },
        )


def record(engine, request: FillRequest) -> Trace:
    """Run `request` on `engine`, keeping every step. The request's own on_step still runs."""
    recorder = Recorder(engine.tokenizer.eos_id, engine.tokenizer.pad_id)
    user_on_step = request.on_step

    def on_step(info: StepInfo) -> None:
        recorder.on_step(info)
        if user_on_step is not None:
            user_on_step(info)

    result = engine.fill(replace(request, on_step=on_step))
    return recorder.trace(request, result, engine.model_name, engine.is_random)


def context_tail(prefix: str, lines: int = CONTEXT_LINES) -> str:
    return "\n".join(prefix.split("\n")[-lines:])


def context_head(suffix: str, lines: int = CONTEXT_LINES) -> str:
    return "\n".join(suffix.split("\n")[:lines])


def build_html(trace: Trace, nonce: str | None = None) -> str:
    """One HTML document that replays `trace`; nothing outside it is loaded.

    With a `nonce` (an editor's webview) the page's own Content-Security-Policy allows only the style and
    script blocks that carry it: no inline style attributes, no inline script without the nonce.
    """
    if nonce is not None and not NONCE.fullmatch(nonce):
        raise ValueError("a nonce is 16-128 characters of A-Z a-z 0-9 + / = _ -")
    data = asdict(trace)
    data["prefix"] = context_tail(trace.prefix.removesuffix(trace.heal))
    data["suffix"] = context_head(trace.suffix)
    # JSON inside <script>: escape "<" so no "</script>" or "<!--" in the text can end the block.
    payload = json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")
    title = f"dfim trace: {plural(trace.steps, 'step')}, {trace.latency_ms:.0f} ms"
    note = " (untrained random checkpoint: its fills are noise)" if trace.random_model else ""
    if nonce is None:
        csp, attr = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'", ""
    else:
        csp, attr = (
            f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'",
            f' nonce="{nonce}"',
        )
    cut = ""
    if trace.cut:  # newlines shown as \n: the cut usually starts with the one that ended the line
        shown = html.escape(trace.cut.replace("\n", "\\n"))
        cut = f'<p id="cut" class="legend">Cut at the stop string; the canvas went on with: <code>{shown}</code></p>'
    values = {
        "CSP": csp,
        "NONCE": attr,
        "TITLE": html.escape(title),
        "MODEL": html.escape(trace.model + note),
        "FINAL": html.escape(trace.fill),
        "CUT": cut,
        "DATA": payload,
    }
    # One pass: a value (the user's code) that happens to contain "@DATA@" is never substituted again.
    return _SLOT.sub(lambda m: values[m.group(1)], _PAGE)


NONCE = re.compile(r"[A-Za-z0-9+/=_-]{16,128}")
_SLOT = re.compile(r"@(CSP|NONCE|TITLE|MODEL|FINAL|CUT|DATA)@")

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="@CSP@">
<title>@TITLE@</title>
<style@NONCE@>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
h1 { font-size: 1.1em; margin: 0 0 .3em; }
.meta { color: #666; margin-bottom: 1em; }
#controls { display: flex; flex-wrap: wrap; gap: .6em; align-items: center; margin-bottom: .8em; }
#slider { flex: 1; min-width: 8em; max-width: 40em; }
#label { font-variant-numeric: tabular-nums; }
.code { font: 13px ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap; background: #fff;
  border: 1px solid #ddd; padding: .8em; line-height: 1.7; }
.ctx { color: #999; }
.tok { border-radius: 2px; padding: 1px 0; }
.tok.renoised { text-decoration: line-through; color: #b33; }
.tok.pin { outline: 1.5px solid #2a62c9; }
.tok.end { color: #777; font-size: 11px; border: 1px dashed #999; padding: 0 2px; }
.tok.pad { color: #ccc; }
.tok.nl, .nl { color: #888; }
.legend span { margin-right: 1.2em; }
.legend .hi { background: rgba(46,160,67,.55); }
.legend .lo { background: rgba(46,160,67,.08); }
h2 { font-size: 1em; margin: 1.2em 0 .3em; }
/* Dark: the browser's dark scheme, or a dark VS Code theme (its webviews put vscode-dark on body). */
@media (prefers-color-scheme: dark) {
  body:not(.vscode-light) { color: #ddd; background: #1e1e1e; }
  body:not(.vscode-light) .code { background: #252526; border-color: #444; }
  body:not(.vscode-light) .tok.renoised { color: #f47067; }
  body:not(.vscode-light) .tok.pad { color: #555; }
}
body.vscode-dark, body.vscode-high-contrast { color: #ddd; background: #1e1e1e; }
body.vscode-dark .code, body.vscode-high-contrast .code { background: #252526; border-color: #444; }
body.vscode-dark .tok.renoised, body.vscode-high-contrast .tok.renoised { color: #f47067; }
body.vscode-dark .tok.pad, body.vscode-high-contrast .tok.pad { color: #555; }
</style></head>
<body>
<h1>@TITLE@</h1>
<div class="meta">model: @MODEL@</div>
<div id="controls">
  <button id="play" type="button">play</button>
  <button id="prev" type="button">&#9664;</button>
  <input id="slider" type="range" min="0" value="0">
  <button id="next" type="button">&#9654;</button>
  <span id="label"></span>
</div>
<div class="legend"><span class="hi">confident</span>
<span class="lo">unsure</span>
<span class="tok renoised">renoised</span><span class="tok pin">pinned</span>
<span class="tok end">EOS</span><span class="tok nl">&#8629;</span> line break</div>
<p id="rule" class="legend"></p>
<h2>Canvas (argmax of each position at this step)</h2>
<div id="canvas" class="code"></div>
<h2>Fill at this step</h2>
<pre id="frame-text" class="code"></pre>
<h2>Committed fill</h2>
<pre id="final" class="code">@FINAL@</pre>
@CUT@
<script id="trace-data" type="application/json">@DATA@</script>
<script@NONCE@>
"use strict";
const T = JSON.parse(document.getElementById("trace-data").textContent);
const slider = document.getElementById("slider");
const playButton = document.getElementById("play");
let timer = null;

function span(cls, text, title) {
  const s = document.createElement("span");
  s.className = cls;
  s.textContent = text;
  if (title) s.title = title;
  return s;
}

// A token's text with its line breaks drawn: a mark, then the break itself (a newline alone is otherwise
// an empty, invisible token).
function tokenNode(cls, text, title) {
  if (!text.includes("\\n")) return span(cls, text, title);
  const s = span(cls, "", title);
  const parts = text.split("\\n");
  parts.forEach((part, k) => {
    if (part) s.appendChild(document.createTextNode(part));
    if (k < parts.length - 1) { s.appendChild(span("nl", "\\u21b5")); s.appendChild(document.createTextNode("\\n")); }
  });
  return s;
}

const R = T.stop_rule || {};
function ruleText() {
  if (!R.early_stop) return "Early stop is off: the fill runs all " + R.max_steps + " steps.";
  return "Stops when the argmax canvas repeats the last " + R.stability_threshold +
    " step(s) and the mean entropy of its text is under " + R.confidence_threshold +
    ", or when every token up to the text's end (EOS or a stop string) is accepted with entropy under " +
    R.confidence_threshold + ", or after " + R.max_steps + " steps.";
}
// Why the fill did not stop at this frame, from what the stop rules measured there.
function whyOn(f) {
  const c = f.checks || {};
  if (f.step === 0 || !R.early_stop || !("doubt" in c)) return "";
  const parts = [];
  if (!c.stable) parts.push("canvas changed");
  if (c.doubt >= R.confidence_threshold) parts.push("entropy " + c.doubt.toFixed(4) + " \\u2265 " + R.confidence_threshold);
  if (!c.end_settled) parts.push("end not settled");
  return parts.length ? "goes on: " + parts.join(", ") : "";
}

function show(i) {
  const f = T.frames[i];
  const canvas = document.getElementById("canvas");
  canvas.replaceChildren(span("ctx", T.prefix));
  for (let p = 0; p < f.tokens.length; p++) {
    const c = f.confidence[p];
    const cls = ["tok"];
    if (!f.kept[p]) cls.push("renoised");
    if (f.pinned[p]) cls.push("pin");
    let text = f.tokens[p];
    if (f.special[p] === "eos") { cls.push("end"); text = "EOS"; }
    else if (f.special[p] === "pad") { cls.push("pad"); text = "\\u00b7"; }
    const s = tokenNode(cls.join(" "), text, "position " + p + (p === 0 && T.heal && f.block === 0 ? ", re-writes " +
      JSON.stringify(T.heal) + " of the prefix (token healing)" : "") + ", confidence " + c.toFixed(3) +
      (f.kept[p] ? ", accepted" : ", renoised") + (f.pinned[p] ? ", pinned" : ""));
    if (!f.special[p]) s.style.background = "rgba(46,160,67," + (0.05 + 0.6 * c).toFixed(3) + ")";
    canvas.appendChild(s);
  }
  canvas.appendChild(span("ctx", T.suffix));
  document.getElementById("frame-text").textContent = f.text;
  const prev = i > 0 ? T.frames[i - 1].ms : 0;
  const last = i === T.frames.length - 1;
  document.getElementById("label").textContent =
    (f.step === 0 ? "the encoder's draft (shade: its probability of each token)" :
      (f.block > 0 ? "block " + (f.block + 1) + ", " : "") + "step " + f.step + "/" + f.max_steps) +
    "  \\u00b7  " + f.ms.toFixed(1) + " ms (+" + (f.ms - prev).toFixed(1) + ")" +
    "  \\u00b7  accepted " + f.accepted + "/" + f.tokens.length +
    "  \\u00b7  mean entropy " + f.mean_entropy.toFixed(3) +
    (last ? "  \\u00b7  stop: " + T.stop_reason : (whyOn(f) ? "  \\u00b7  " + whyOn(f) : ""));
  slider.value = i;
}

function stop() { clearInterval(timer); timer = null; playButton.textContent = "play"; }
function play() {
  if (timer) { stop(); return; }
  if (+slider.value >= T.frames.length - 1) show(0);
  playButton.textContent = "pause";
  timer = setInterval(() => {
    const i = +slider.value + 1;
    if (i >= T.frames.length) { stop(); return; }
    show(i);
  }, 250);
}

document.getElementById("rule").textContent = ruleText();
if (T.frames.length) {
  slider.max = T.frames.length - 1;
  slider.addEventListener("input", () => { stop(); show(+slider.value); });
  playButton.addEventListener("click", play);
  document.getElementById("prev").addEventListener("click", () => { stop(); show(Math.max(0, +slider.value - 1)); });
  document.getElementById("next").addEventListener("click", () => {
    stop(); show(Math.min(T.frames.length - 1, +slider.value + 1));
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "ArrowLeft") document.getElementById("prev").click();
    if (e.key === "ArrowRight") document.getElementById("next").click();
  });
  show(T.frames.length - 1);  // open on the last frame: the committed fill
}
</script>
</body></html>
"""
