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
    onDidChangeTextDocument: () => disposable,
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
  async sendNotification(): Promise<void> {}
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
  assert.deepEqual(last().initializationOptions.model, { path: "", device: "cpu", fast: true });
  try {
    state.config = { serverArgs: ["--model", "/ckpt", "--device", "cuda"] };
    await state.commands.get("dfim.client.restart")!();
    assert.deepEqual(state.serverOptions.at(-1), { command: "dfim", args: ["serve", "--model", "/ckpt", "--device", "cuda"] });
    assert.deepEqual(last().initializationOptions.model, { path: "/ckpt", device: "cuda", fast: true });
    // workspace/configuration "dfim" answers the same
    const answer = await last().middleware.workspace.configuration({ items: [{ section: "dfim" }] }, undefined, undefined);
    assert.deepEqual((answer[0] as Record<string, unknown>).model, { path: "/ckpt", device: "cuda", fast: true });

    state.config = { ...state.config, "model.device": "cpu" }; // set in the settings: it wins
    const again = await last().middleware.workspace.configuration({ items: [{ section: "dfim" }] }, undefined, undefined);
    assert.deepEqual((again[0] as Record<string, unknown>).model, { path: "/ckpt", device: "cpu", fast: true });
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

test("showCanvas on a server without dfim/lastTrace is an error message", async () => {
  state.answer = new Error("Method Not Found: dfim/lastTrace");
  state.messages.length = 0;
  await state.commands.get("dfim.client.showCanvas")!();
  assert.deepEqual(state.messages, [["error", "dfim: this server does not record fills (update dfim)."]]);
  await extension.deactivate();
});
