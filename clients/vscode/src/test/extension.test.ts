// The command wiring of extension.ts, in plain node: `vscode` and `vscode-languageclient/node` are replaced by
// small fakes before the extension loads, then `activate` runs and the registered commands are invoked.

import assert from "node:assert/strict";
import Module from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { before, test } from "node:test";

type Fn = (...args: unknown[]) => unknown;
const disposable = { dispose: () => undefined };

interface FakePanel {
  viewType: string;
  title: string;
  options: Record<string, unknown>;
  webview: { html: string };
  revealed: number;
  disposeListeners: Fn[];
}

const state = {
  commands: new Map<string, Fn>(),
  panels: [] as FakePanel[],
  messages: [] as [string, string][],
  requests: [] as [string, unknown][],
  notifications: [] as [string, unknown][],
  changeListeners: [] as Fn[],
  answer: null as unknown,
  serverOptions: [] as unknown[],
  clientOptions: [] as Record<string, unknown>[],
  config: {} as Record<string, unknown>, // user settings, keys below `dfim.`
};

const vscode = {
  StatusBarAlignment: { Left: 1, Right: 2 },
  ViewColumn: { Active: -1, Beside: -2 },
  ProgressLocation: { Notification: 15 },
  ConfigurationTarget: { Global: 1 },
  ThemeColor: class {
    constructor(public id: string) {}
  },
  window: {
    createOutputChannel: () => ({ appendLine: () => undefined, show: () => undefined, dispose: () => undefined }),
    createStatusBarItem: () => ({ show: () => undefined, dispose: () => undefined }),
    showInformationMessage: async (m: string) => void state.messages.push(["info", m]),
    showWarningMessage: async (m: string) => void state.messages.push(["warning", m]),
    showErrorMessage: async (m: string) => void state.messages.push(["error", m]),
    createWebviewPanel: (viewType: string, title: string, _column: number, options: Record<string, unknown>) => {
      const panel: FakePanel & Record<string, unknown> = {
        viewType,
        title,
        options,
        webview: { html: "" },
        revealed: 0,
        disposeListeners: [],
        reveal: () => void panel.revealed++,
        onDidDispose: (fn: Fn) => {
          panel.disposeListeners.push(fn);
          return disposable;
        },
      };
      state.panels.push(panel);
      return panel;
    },
    onDidChangeTextEditorSelection: () => disposable,
    activeTextEditor: undefined,
  },
  commands: {
    registerCommand: (id: string, fn: Fn) => {
      assert.ok(!state.commands.has(id), `${id} registered twice`);
      state.commands.set(id, fn);
      return disposable;
    },
    executeCommand: async () => undefined,
  },
  workspace: {
    // like VS Code's: a set value, else the caller's fallback, else the manifest default
    getConfiguration: () => ({
      get: (key: string, fallback?: unknown) =>
        key in state.config ? state.config[key] : (fallback ?? manifest.contributes.configuration.properties[`dfim.${key}`]?.default),
      inspect: (key: string) => ({
        key: `dfim.${key}`,
        defaultValue: manifest.contributes.configuration.properties[`dfim.${key}`]?.default,
        globalValue: state.config[key],
      }),
      update: async () => undefined,
    }),
    onDidChangeConfiguration: () => disposable,
    onDidChangeTextDocument: (fn: Fn) => {
      state.changeListeners.push(fn);
      return disposable;
    },
    onDidCloseTextDocument: () => disposable,
  },
};

const State = { Stopped: 1, Running: 2, Starting: 3 };

class LanguageClient {
  private stateListener: Fn = () => undefined;
  constructor(_id: string, _name: string, serverOptions: unknown, clientOptions: Record<string, unknown>) {
    state.serverOptions.push(serverOptions);
    state.clientOptions.push(clientOptions);
  }
  registerProposedFeatures(): void {}
  onDidChangeState(fn: Fn) {
    this.stateListener = fn;
    return disposable;
  }
  async start(): Promise<void> {
    this.stateListener({ oldState: State.Starting, newState: State.Running });
  }
  async stop(): Promise<void> {}
  onNotification() {
    return disposable;
  }
  async sendNotification(method: string, params: unknown): Promise<void> {
    state.notifications.push([method, params]);
  }
  async sendRequest(method: string, params: unknown): Promise<unknown> {
    state.requests.push([method, params]);
    if (state.answer instanceof Error) throw state.answer;
    return state.answer;
  }
}

const languageclient = {
  LanguageClient,
  State,
  TransportKind: { stdio: 0 },
  DidChangeConfigurationNotification: { type: {} },
  ExecuteCommandRequest: { type: {} },
};

const manifest = JSON.parse(readFileSync(join(__dirname, "..", "..", "package.json"), "utf8"));
let extension: { activate(context: unknown): Promise<void>; deactivate(): Promise<void> };

before(async () => {
  const mod = Module as unknown as { _load: (request: string, ...rest: unknown[]) => unknown };
  const load = mod._load;
  mod._load = function (request: string, ...rest: unknown[]) {
    if (request === "vscode") return vscode;
    if (request === "vscode-languageclient/node") return languageclient;
    return load.call(this, request, ...rest);
  };
  extension = require("../extension");
  await extension.activate({ subscriptions: [], extension: { packageJSON: manifest } });
});

test("every command the manifest declares is registered, and only those", () => {
  const declared = (manifest.contributes.commands as { command: string }[]).map((c) => c.command).sort();
  assert.deepEqual([...state.commands.keys()].sort(), declared);
  const canvas = manifest.contributes.commands.find((c: { command: string }) => c.command === "dfim.client.showCanvas");
  assert.equal(`${canvas.category}: ${canvas.title}`, "dfim: Show Denoising Canvas of the Last Fill");
});

test("the server runs as `dfim serve` on plain stdio: no transport, so no --stdio is appended", () => {
  // vscode-languageclient appends --stdio for TransportKind.stdio; older dfim servers refuse that argument
  assert.deepEqual(state.serverOptions, [{ command: "dfim", args: ["serve"] }]);
});

test("--model/--device in dfim.serverArgs reach the server; model.path/model.device only when set", async () => {
  type Options = {
    initializationOptions: Record<string, unknown>;
    middleware: { workspace: { configuration: (params: unknown, token: unknown, next: unknown) => Promise<unknown[]> } };
  };
  const last = () => state.clientOptions.at(-1) as Options;
  assert.deepEqual(last().initializationOptions.model, { path: "", device: "cpu", fast: true, compile: false });
  try {
    state.config = { serverArgs: ["--model", "/ckpt", "--device", "cuda"] };
    await state.commands.get("dfim.client.restart")!();
    assert.deepEqual(state.serverOptions.at(-1), { command: "dfim", args: ["serve", "--model", "/ckpt", "--device", "cuda"] });
    assert.deepEqual(last().initializationOptions.model, { path: "/ckpt", device: "cuda", fast: true, compile: false });
    // workspace/configuration "dfim" answers the same
    const answer = await last().middleware.workspace.configuration({ items: [{ section: "dfim" }] }, undefined, undefined);
    assert.deepEqual((answer[0] as Record<string, unknown>).model, { path: "/ckpt", device: "cuda", fast: true, compile: false });

    state.config = { ...state.config, "model.device": "cpu" }; // set in the settings: it wins
    const again = await last().middleware.workspace.configuration({ items: [{ section: "dfim" }] }, undefined, undefined);
    assert.deepEqual((again[0] as Record<string, unknown>).model, { path: "/ckpt", device: "cpu", fast: true, compile: false });
  } finally {
    state.config = {};
  }
});

test("showCanvas puts the server's last trace in one locked-down webview panel", async () => {
  const run = state.commands.get("dfim.client.showCanvas")!;
  state.answer = {
    html: '<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><pre id="final">return a + b</pre></body></html>',
    fill: "return a + b",
    steps: 3,
    frames: 3,
    latencyMs: 41.2,
    stopReason: "stable",
    model: "dfim-small",
    randomModel: false,
  };
  await run();
  assert.equal(state.panels.length, 1);
  const panel = state.panels[0];
  const [method, params] = state.requests.at(-1)!;
  assert.equal(method, "dfim/lastTrace");
  const nonce = (params as { nonce: string }).nonce;
  assert.match(panel.webview.html, new RegExp(`<head><meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'nonce-${nonce}'; script-src 'nonce-${nonce}'">`));
  assert.match(panel.webview.html, /return a \+ b/);
  assert.equal(panel.title, "dfim canvas: 3 steps, 41 ms");
  assert.deepEqual(panel.options, { enableScripts: true, enableCommandUris: false, localResourceRoots: [] });
  assert.equal(panel.revealed, 1);

  // again: the same panel, a new page with a new nonce
  state.answer = { ...(state.answer as object), html: "<html><head></head><body>second</body></html>", frames: 5, steps: 5 };
  await run();
  assert.equal(state.panels.length, 1);
  const second = (state.requests.at(-1)![1] as { nonce: string }).nonce;
  assert.notEqual(second, nonce);
  assert.match(panel.webview.html, /second/);
  assert.ok(panel.webview.html.includes(`'nonce-${second}'`));
  assert.equal(panel.title, "dfim canvas: 5 steps, 41 ms");

  // closed by the user: the next call opens a fresh panel
  for (const fn of panel.disposeListeners) fn();
  await run();
  assert.equal(state.panels.length, 2);
});

test("showCanvas before any fill says so and opens nothing", async () => {
  const panels = state.panels.length;
  state.answer = null;
  state.messages.length = 0;
  await state.commands.get("dfim.client.showCanvas")!();
  assert.equal(state.panels.length, panels);
  assert.equal(state.messages[0][0], "info");
  assert.match(state.messages[0][1], /no fill yet/);
});

// Inline completion itself is vscode-languageclient's provider and VS Code's own ghost text, next-suggestion
// command and Tab: none of them runs in plain node (the real editor is driven by scripts/install-check.sh).
// What the extension adds is its middleware around the provider and the accept command; these check that it
// hands VS Code's cycling and Tab-Tab requests to the server as they are and every answer back.

type Middleware = {
  provideInlineCompletionItems: (document: unknown, position: unknown, context: unknown, token: unknown, next: Fn) => Promise<unknown>;
  executeCommand: (command: string, args: unknown[], next: Fn) => Promise<unknown>;
};
const URI = "file:///work/add.py";
const doc = { uri: { toString: () => URI } };
const INVOKE = 0; // vscode.InlineCompletionTriggerKind.Invoke: the next-suggestion command, Alt+]
const AUTOMATIC = 1; // vscode.InlineCompletionTriggerKind.Automatic: typing, or the edit of an accept
const item = (id: string, text: string, line: number, character: number) => ({
  insertText: text,
  range: { start: { line, character }, end: { line, character } },
  command: { title: "dfim: accepted", command: "dfim.inlineAccepted", arguments: [id] },
});

/** Ask through the middleware as vscode-languageclient's provider does; `answer` is what the server returns. */
async function provide(position: { line: number; character: number }, triggerKind: number, answer: unknown) {
  const middleware = (state.clientOptions.at(-1) as { middleware: Middleware }).middleware;
  const context = { triggerKind, selectedCompletionInfo: undefined };
  const token = { isCancellationRequested: false };
  const calls: unknown[][] = [];
  const result = await middleware.provideInlineCompletionItems(doc, position, context, token, async (...args: unknown[]) => {
    calls.push(args);
    return answer;
  });
  assert.equal(calls.length, 1, "the request went to the server once");
  assert.deepEqual(calls[0], [doc, position, context, token]); // as it came: the trigger kind untouched
  assert.equal(calls[0][2], context);
  return result;
}

/** VS Code inserted `text` at `at` (an accept) and ran the item's accept command. */
async function accept(text: string, at: { line: number; character: number }, id: string) {
  const middleware = (state.clientOptions.at(-1) as { middleware: Middleware }).middleware;
  for (const fn of state.changeListeners) {
    fn({ document: doc, contentChanges: [{ range: { start: at, end: at }, rangeLength: 0, text }] });
  }
  const forwarded: unknown[][] = [];
  await middleware.executeCommand("dfim.inlineAccepted", [id], async (...args: unknown[]) => void forwarded.push(args));
  assert.deepEqual(forwarded, [["dfim.inlineAccepted", [id]]]); // the server records the accept of this id
}

test("cycling: VS Code's invoked request reaches the server as Invoked, and every candidate comes back", async () => {
  const shown = { items: [item("a", "a + b", 1, 11)] };
  assert.equal(await provide({ line: 1, character: 11 }, AUTOMATIC, shown), shown);
  const candidates = { items: [item("c1", "a - b", 1, 11), item("c2", "b + a", 1, 11), item("c3", "sum((a, b))", 1, 11)] };
  const result = (await provide({ line: 1, character: 11 }, INVOKE, candidates)) as typeof candidates;
  assert.equal(result, candidates);
  assert.deepEqual(result.items.map((i) => i.insertText), ["a - b", "b + a", "sum((a, b))"]);
  // the user stepped to the second candidate and pressed Tab: its own id goes to the server
  await accept("b + a", { line: 1, character: 11 }, "c2");
});

test("Tab-Tab: after an accept, the request at the new cursor goes to the server and its answer is shown", async () => {
  state.notifications.length = 0;
  const first = { items: [item("t1", "a + b", 1, 11)] };
  assert.equal(await provide({ line: 1, character: 11 }, AUTOMATIC, first), first);
  await accept("a + b", { line: 1, character: 11 }, "t1");
  // VS Code asks at once at the new cursor; nothing on the client holds it back or answers it itself
  const next = { items: [item("t2", "  # sum", 1, 16)] };
  assert.equal(await provide({ line: 1, character: 16 }, AUTOMATIC, next), next);
  // the accepted suggestion was not reported rejected when the next one replaced it
  const rejected = state.notifications.filter(([method, params]) => method === "dfim/inlineRejected" && (params as { id: string }).id === "t1");
  assert.deepEqual(rejected, []);
});

test("showCanvas on a server without dfim/lastTrace is an error message", async () => {
  state.answer = new Error("Method Not Found: dfim/lastTrace");
  state.messages.length = 0;
  await state.commands.get("dfim.client.showCanvas")!();
  assert.deepEqual(state.messages, [["error", "dfim: this server does not record fills (update dfim)."]]);
  await extension.deactivate();
});
