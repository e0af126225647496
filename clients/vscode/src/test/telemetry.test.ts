import assert from "node:assert/strict";
import { test } from "node:test";
import { advance, PARTIAL_METHOD, REJECT_METHOD, suggestionId, SuggestionWatcher } from "../telemetry";

const U = "file:///a.py";
const at = (line: number, character: number) => ({ line, character });
const ins = (line: number, character: number, text: string) => ({ start: at(line, character), rangeLength: 0, text });

test("the suggestion id comes from the accept command only", () => {
  assert.equal(suggestionId({ command: "dfim.inlineAccepted", arguments: ["abc"] }), "abc");
  assert.equal(suggestionId({ command: "other", arguments: ["abc"] }), undefined);
  assert.equal(suggestionId({ command: "dfim.inlineAccepted", arguments: [] }), undefined);
  assert.equal(suggestionId(undefined), undefined);
});

test("advance over text with and without line breaks", () => {
  assert.deepEqual(advance(at(2, 4), "abc"), at(2, 7));
  assert.deepEqual(advance(at(2, 4), "ab\n  cd"), at(3, 4));
  assert.deepEqual(advance(at(2, 4), "ab\r\n"), at(3, 0));
});

test("accept word then accept the rest: cumulative partial events", () => {
  const w = new SuggestionWatcher();
  assert.deepEqual(w.shown(U, "s1", at(3, 8), "return a + b"), []);
  assert.deepEqual(w.change(U, [ins(3, 8, "return ")]), [{ method: PARTIAL_METHOD, params: { id: "s1", acceptedLength: 7 } }]);
  assert.deepEqual(w.cursor(U, at(3, 15)), []); // the cursor follows the insert
  assert.deepEqual(w.change(U, [ins(3, 15, "a + b")]), [{ method: PARTIAL_METHOD, params: { id: "s1", acceptedLength: 12 } }]);
  assert.deepEqual(w.end(), []); // finished
});

test("a full accept runs the command: the watcher says nothing", () => {
  const w = new SuggestionWatcher();
  w.shown(U, "s1", at(0, 0), "x = 1");
  w.accepted("s1");
  assert.deepEqual(w.change(U, [ins(0, 0, "x = 1")]), []);
  assert.deepEqual(w.cursor(U, at(9, 9)), []);
});

test("dismissed by moving away or typing something else: rejected once", () => {
  const w = new SuggestionWatcher();
  w.shown(U, "s1", at(1, 0), "foo()");
  assert.deepEqual(w.cursor(U, at(5, 0)), [{ method: REJECT_METHOD, params: { id: "s1" } }]);
  assert.deepEqual(w.cursor(U, at(6, 0)), []);
  w.shown(U, "s2", at(1, 0), "foo()");
  assert.deepEqual(w.change(U, [ins(1, 0, "b")]), [{ method: REJECT_METHOD, params: { id: "s2" } }]);
});

test("typing the suggestion is left to the server's typed-ahead tracking", () => {
  const w = new SuggestionWatcher();
  w.shown(U, "s1", at(1, 0), "foo()");
  assert.deepEqual(w.change(U, [ins(1, 0, "f")]), []);
  assert.deepEqual(w.shown(U, "s1", at(1, 1), "oo()"), []); // the server's typed-ahead rest: same id
  assert.deepEqual(w.change(U, [ins(1, 1, "o")]), []);
  assert.deepEqual(w.cursor(U, at(7, 0)), []); // typed part of it: not a rejection
});

test("a new suggestion ends the previous one", () => {
  const w = new SuggestionWatcher();
  w.shown(U, "s1", at(1, 0), "foo()");
  assert.deepEqual(w.shown(U, "s2", at(2, 0), "bar()"), [{ method: REJECT_METHOD, params: { id: "s1" } }]);
});

test("edits in other documents and closing are not rejections", () => {
  const w = new SuggestionWatcher();
  w.shown(U, "s1", at(1, 0), "foo()");
  assert.deepEqual(w.change("file:///b.py", [ins(0, 0, "zz")]), []);
  w.closed(U);
  assert.deepEqual(w.end(), []);
});

test("items without a dfim id are ignored", () => {
  const w = new SuggestionWatcher();
  assert.deepEqual(w.shown(U, undefined, at(0, 0), "x"), []);
  assert.deepEqual(w.cursor(U, at(3, 3)), []);
});
