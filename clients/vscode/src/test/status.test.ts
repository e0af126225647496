import assert from "node:assert/strict";
import { test } from "node:test";
import { becameReady, formatLatency, formatStats, formatStatus, prefixed } from "../status";

test("latency: ms below a second, seconds above, nothing when unknown", () => {
  assert.equal(formatLatency(83.6), "84 ms");
  assert.equal(formatLatency(1530), "1.5 s");
  assert.equal(formatLatency(null), "");
  assert.equal(formatLatency(undefined), "");
  assert.equal(formatLatency(Number.NaN), "");
});

test("ready shows the last latency and steps", () => {
  const v = formatStatus({ state: "ready", model: "dfim-small", device: "cpu", lastLatencyMs: 84.2, lastSteps: 6, lastStopReason: "stable" }, true);
  assert.equal(v.text, "$(sparkle) dfim 84 ms · 6 steps");
  assert.equal(v.severity, "normal");
  assert.match(v.tooltip, /model: dfim-small/);
  assert.match(v.tooltip, /last fill: 84 ms, 6 steps, stopped: stable/);
});

test("a suggestion the gate hid says so, and why, until one is shown", () => {
  const hidden = { state: "ready", lastLatencyMs: 84.2, lastSteps: 1, lastHidden: "unsure: min_probability 0.390 < 0.47" };
  const v = formatStatus(hidden, true);
  assert.equal(v.text, "$(sparkle) dfim 84 ms · 1 step · hidden");
  assert.match(v.tooltip, /hidden by the confidence gate \(unsure: min_probability 0.390 < 0.47\); Alt\+\\ asks/);
  assert.equal(formatStatus({ ...hidden, lastHidden: null }, true).text, "$(sparkle) dfim 84 ms · 1 step");
});

test("ready before any fill is just the name", () => {
  assert.equal(formatStatus({ state: "ready" }, true).text, "$(sparkle) dfim");
});

test("loading, busy and error states", () => {
  assert.equal(formatStatus({ state: "loading" }, true).text, "$(sync~spin) dfim");
  assert.equal(formatStatus({ state: "busy" }, true).text, "$(loading~spin) dfim");
  const err = formatStatus({ state: "error", message: "no such checkpoint /x" }, true);
  assert.equal(err.severity, "error");
  assert.match(err.tooltip, /no such checkpoint/);
});

test("an untrained checkpoint is a warning", () => {
  const v = formatStatus({ state: "ready", model: "random-tiny", isRandom: true }, true);
  assert.equal(v.severity, "warning");
  assert.match(v.tooltip, /untrained/);
});

test("toggled off wins over the server state", () => {
  const v = formatStatus({ state: "ready", lastLatencyMs: 10 }, false);
  assert.equal(v.text, "$(circle-slash) dfim");
  assert.match(v.tooltip, /off/);
});

test("client-side failures need no server status", () => {
  const failed = formatStatus(undefined, true, "failed", "spawn dfim ENOENT");
  assert.equal(failed.severity, "error");
  assert.match(failed.tooltip, /ENOENT/);
  assert.match(failed.tooltip, /dfim.serverPath/);
  assert.equal(formatStatus(undefined, true, "starting").text, "$(sync~spin) dfim");
  assert.equal(formatStatus(undefined, true, "stopped").severity, "warning");
});

test("stats: counters then the status", () => {
  const text = formatStats({ fills: 3, cache_hits: 1, status: { state: "ready", model: "m", lastLatencyMs: 12, lastSteps: 2, lastStopReason: "stable" }, encoding: "utf-8" });
  assert.match(text, /^fills\s+3$/m);
  assert.match(text, /^cache_hits\s+1$/m);
  assert.match(text, /^encoding\s+utf-8$/m);
  assert.match(text, /^state\s+ready$/m);
  assert.match(text, /^last fill\s+12 ms, 2 steps, stable$/m);
});

test("ready after loading, an error or nothing asks again; busy and ready again do not", () => {
  assert.equal(becameReady(undefined, { state: "ready" }), true);
  assert.equal(becameReady({ state: "loading" }, { state: "ready" }), true);
  assert.equal(becameReady({ state: "error" }, { state: "ready" }), true);
  assert.equal(becameReady({ state: "busy" }, { state: "ready" }), false);
  assert.equal(becameReady({ state: "ready" }, { state: "ready", lastSteps: 3 }), false);
  assert.equal(becameReady({ state: "ready" }, { state: "loading" }), false);
});

test("one dfim: prefix", () => {
  assert.equal(prefixed("dfim: the model is not ready"), "dfim: the model is not ready");
  assert.equal(prefixed("no fill"), "dfim: no fill");
});
