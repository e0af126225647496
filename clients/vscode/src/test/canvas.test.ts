import assert from "node:assert/strict";
import { test } from "node:test";
import { canvasTitle, CanvasHost, LAST_TRACE_METHOD, LastTrace, makeNonce, showLastCanvas, webviewHtml } from "../canvas";

const PAGE =
  '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n' +
  "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'nonce-N'; script-src 'nonce-N'\">" +
  '<title>t</title></head><body><pre id="final">x</pre></body></html>';

const TRACE: LastTrace = {
  html: PAGE,
  fill: "x",
  steps: 6,
  frames: 6, // the server keeps at most the last 256 steps; the title counts all
  latencyMs: 83.6,
  stopReason: "stable",
  model: "dfim-small",
  randomModel: false,
};

function fakeHost(answer: LastTrace | null | Error) {
  const calls = { requests: [] as [string, { nonce: string }][], shown: [] as [string, string][], info: [] as string[], error: [] as string[] };
  const host: CanvasHost = {
    request: async (method, params) => {
      calls.requests.push([method, params]);
      if (answer instanceof Error) throw answer;
      return answer;
    },
    show: (title, html) => void calls.shown.push([title, html]),
    info: (m) => void calls.info.push(m),
    error: (m) => void calls.error.push(m),
  };
  return { host, calls };
}

test("nonces are fresh base64url strings the server accepts (16-128 of A-Z a-z 0-9 + / = _ -)", () => {
  const a = makeNonce();
  const b = makeNonce();
  assert.match(a, /^[A-Za-z0-9_-]{16,128}$/);
  assert.notEqual(a, b);
});

test("the client's policy goes first in <head>, before the page's own", () => {
  const html = webviewHtml(PAGE, "abcdefghijklmnop1234");
  const client = html.indexOf("script-src 'nonce-abcdefghijklmnop1234'");
  assert.ok(client > html.indexOf("<head>") && client < html.indexOf("<meta charset"));
  assert.match(html, /default-src 'none'; style-src 'nonce-abcdefghijklmnop1234'/);
  assert.ok(html.endsWith("</html>"));
  // a fragment without <head> is wrapped in a document carrying the policy
  assert.match(webviewHtml("<p>hi</p>", "abcdefghijklmnop1234"), /^<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy"/);
});

test("shows the last fill's page with the nonce it sent", async () => {
  const { host, calls } = fakeHost(TRACE);
  assert.equal(await showLastCanvas(host), "shown");
  assert.equal(calls.requests.length, 1);
  const [method, params] = calls.requests[0];
  assert.equal(method, LAST_TRACE_METHOD);
  assert.match(params.nonce, /^[A-Za-z0-9_-]{16,128}$/);
  const [title, html] = calls.shown[0];
  assert.equal(title, canvasTitle(TRACE));
  assert.equal(title, "dfim canvas: 6 steps, 84 ms");
  assert.ok(html.includes(`script-src 'nonce-${params.nonce}'`));
  assert.ok(html.includes('<pre id="final">x</pre>'));
});

test("no fill yet is a message, not an empty panel", async () => {
  const { host, calls } = fakeHost(null);
  assert.equal(await showLastCanvas(host), "none");
  assert.equal(calls.shown.length, 0);
  assert.match(calls.info[0], /no fill yet/);
});

test("an older server without the request, and other failures, are errors", async () => {
  const old = fakeHost(new Error("Unhandled method dfim/lastTrace"));
  assert.equal(await showLastCanvas(old.host), "failed");
  assert.match(old.calls.error[0], /does not record fills/);
  const broken = fakeHost(new Error("boom"));
  assert.equal(await showLastCanvas(broken.host), "failed");
  assert.match(broken.calls.error[0], /could not get the canvas: boom/);
  assert.equal(broken.calls.shown.length, 0);
});
