// The VS Code side of dfim: starts `dfim serve`, lets vscode-languageclient provide inline completions and
// code actions, and adds the commands, the status bar item and the telemetry the server cannot see.

import * as vscode from "vscode";
import {
  DidChangeConfigurationNotification,
  ExecuteCommandRequest,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
} from "vscode-languageclient/node";
import { LastTrace, showLastCanvas } from "./canvas";
import { DOCUMENT_SELECTOR, serverCommand, serverKeys, serverSettings, settingsReader } from "./settings";
import { becameReady, ClientState, formatStats, formatStatus, prefixed, ServerStatus, STATUS_METHOD } from "./status";
import { ACCEPT_COMMAND, Change, suggestionId, SuggestionWatcher, TelemetryEvent } from "./telemetry";

const STATS_METHOD = "dfim/stats";
const SECTION = "dfim";

let client: LanguageClient | undefined;
let lastStatus: ServerStatus | undefined;
let clientState: ClientState = "starting";
let clientError = "";
let statusItem: vscode.StatusBarItem;
let output: vscode.LogOutputChannel;
let statsOutput: vscode.OutputChannel;
let canvasPanel: vscode.WebviewPanel | undefined;
let keys: string[] = [];
const watcher = new SuggestionWatcher();

function config(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration(SECTION);
}

function inlineEnabled(): boolean {
  return config().get<boolean>("inline.enabled", true);
}

/** What the server gets for `initializationOptions`, `workspace/configuration` and didChangeConfiguration.
 * `model.path`/`model.device` left at their defaults yield to `--model`/`--device` in dfim.serverArgs. */
function currentServerSettings(): Record<string, unknown> {
  const cfg = config();
  const read = settingsReader(
    (key) => cfg.get(key),
    (key) => cfg.inspect(key),
    cfg.get("serverArgs"),
  );
  return serverSettings(keys, read);
}

function renderStatus(): void {
  const view = formatStatus(lastStatus, inlineEnabled(), clientState, clientError);
  statusItem.text = view.text;
  statusItem.tooltip = view.tooltip;
  statusItem.backgroundColor =
    view.severity === "error"
      ? new vscode.ThemeColor("statusBarItem.errorBackground")
      : view.severity === "warning"
        ? new vscode.ThemeColor("statusBarItem.warningBackground")
        : undefined;
  statusItem.show();
}

function send(events: TelemetryEvent[]): void {
  if (!client || events.length === 0 || clientState !== "running") return;
  for (const event of events) {
    client.sendNotification(event.method, event.params).catch(() => undefined);
  }
}

function buildClient(): LanguageClient {
  const cfg = config();
  const { command, args } = serverCommand(cfg.get("serverPath"), cfg.get("serverArgs"));
  // No `transport`: the client then talks over the process's stdio without appending `--stdio` to args.
  const serverOptions: ServerOptions = { command, args };
  const clientOptions: LanguageClientOptions = {
    documentSelector: DOCUMENT_SELECTOR,
    outputChannel: output,
    initializationOptions: currentServerSettings(),
    middleware: {
      workspace: {
        // The server asks for section "dfim": answer with its own tree only (no client-only keys).
        configuration: async (params, token, next) => {
          if (params.items.every((item) => item.section === SECTION)) {
            return params.items.map(() => currentServerSettings());
          }
          const result = await next(params, token);
          if (!Array.isArray(result)) return result;
          return result.map((value, i) => (params.items[i].section === SECTION ? currentServerSettings() : value));
        },
      },
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        if (!inlineEnabled()) return undefined;
        const result = await next(document, position, context, token);
        const items = Array.isArray(result) ? result : result?.items;
        const first = items?.[0];
        if (!first && context.triggerKind === vscode.InlineCompletionTriggerKind.Invoke && !token.isCancellationRequested) {
          // asked for (Alt+\), and nothing came: say so where the eye is, for a moment
          vscode.window.setStatusBarMessage("dfim: no suggestion here", 2500);
        }
        if (first && typeof first.insertText === "string") {
          const start = first.range?.start ?? position;
          send(
            watcher.shown(document.uri.toString(), suggestionId(first.command), start, first.insertText),
          );
        }
        return result;
      },
      executeCommand: async (command, args, next) => {
        if (command === ACCEPT_COMMAND && typeof args[0] === "string") watcher.accepted(args[0]);
        return next(command, args);
      },
    },
  };
  const lc = new LanguageClient("dfim", "dfim", serverOptions, clientOptions);
  // Inline completion is a proposed feature in the 3.17 protocol line; registering them is harmless where
  // it has become standard and required where it has not.
  lc.registerProposedFeatures();
  lc.onDidChangeState((e) => {
    clientState = e.newState === State.Running ? "running" : e.newState === State.Starting ? "starting" : "stopped";
    renderStatus();
  });
  return lc;
}

async function startClient(context: vscode.ExtensionContext): Promise<void> {
  client = buildClient();
  clientState = "starting";
  clientError = "";
  renderStatus();
  try {
    await client.start();
  } catch (err) {
    clientState = "failed";
    clientError = err instanceof Error ? err.message : String(err);
    renderStatus();
    const choice = await vscode.window.showErrorMessage(
      `dfim: could not start the language server (${clientError}). Is \`dfim\` installed? Set dfim.serverPath to its full path.`,
      "Open settings",
    );
    if (choice) await vscode.commands.executeCommand("workbench.action.openSettings", "dfim.serverPath");
    return;
  }
  context.subscriptions.push(
    client.onNotification(STATUS_METHOD, (status: ServerStatus) => {
      const askAgain = becameReady(lastStatus, status);
      lastStatus = status;
      renderStatus();
      if (askAgain) askInlineAgain();
    }),
  );
}

/** The model just became ready: ask for the suggestion at the cursor again, in an editor dfim serves. */
function askInlineAgain(): void {
  const editor = vscode.window.activeTextEditor;
  if (!editor || !inlineEnabled() || !vscode.languages.match(DOCUMENT_SELECTOR, editor.document)) return;
  void vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
}

async function restartClient(context: vscode.ExtensionContext): Promise<void> {
  const old = client;
  client = undefined;
  lastStatus = undefined;
  if (old) await old.stop().catch(() => undefined);
  await startClient(context);
}

function requireClient(): LanguageClient | undefined {
  if (client && clientState === "running") return client;
  void vscode.window.showWarningMessage("dfim: the language server is not running.");
  return undefined;
}

/** Run one of the server's action commands (`dfim.<action>` with [uri, range, instruction?]) on the selection. */
async function runAction(action: string, title: string, needsSelection: boolean, instruction?: string): Promise<void> {
  const editor = vscode.window.activeTextEditor;
  const lc = requireClient();
  if (!editor || !lc) return;
  if (needsSelection && editor.selection.isEmpty) {
    void vscode.window.showInformationMessage(`dfim: select the code first (${title}).`);
    return;
  }
  const c2p = lc.code2ProtocolConverter;
  const args: unknown[] = [c2p.asUri(editor.document.uri), c2p.asRange(editor.selection)];
  if (instruction) args.push(instruction);
  try {
    const result = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `dfim: ${title}`, cancellable: true },
      (_progress, token) =>
        lc.sendRequest(ExecuteCommandRequest.type, { command: `dfim.${action}`, arguments: args }, token),
    );
    const applied = (result as { applied?: boolean } | null)?.applied;
    if (applied === false) {
      void vscode.window.showWarningMessage("dfim: the document changed while the model worked; nothing was applied.");
    }
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    if (!/cancel/i.test(message)) void vscode.window.showErrorMessage(prefixed(message));
  }
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  output = vscode.window.createOutputChannel("dfim", { log: true });
  statsOutput = vscode.window.createOutputChannel("dfim stats");
  const properties = context.extension.packageJSON?.contributes?.configuration?.properties ?? {};
  keys = serverKeys(properties);
  statusItem = vscode.window.createStatusBarItem("dfim.status", vscode.StatusBarAlignment.Right, 100);
  statusItem.name = "dfim";
  statusItem.command = "dfim.client.toggle";
  context.subscriptions.push(output, statsOutput, statusItem);

  const register = (id: string, fn: (...args: unknown[]) => unknown) =>
    context.subscriptions.push(vscode.commands.registerCommand(id, fn));

  register("dfim.client.rewriteSelection", async () => {
    if (vscode.window.activeTextEditor?.selection.isEmpty ?? true) {
      void vscode.window.showInformationMessage("dfim: select the code to rewrite first.");
      return;
    }
    const instruction = await vscode.window.showInputBox({
      title: "dfim: Rewrite the selection",
      prompt: "Optional instruction; the shipped model ignores it (an instruction-tuned checkpoint reads it). Enter redoes the selection.",
      placeHolder: "instruction (leave empty)",
    });
    if (instruction === undefined) return; // Escape
    await runAction("rewriteSelection", "Rewrite the selection", true, instruction.trim() || undefined);
  });
  register("dfim.client.fillSelectionHoles", () => runAction("fillSelectionHoles", "Fill every hole in the selection", true));
  register("dfim.client.regenerateUnsure", () => runAction("regenerateUnsure", "Regenerate the unsure tokens", true));
  register("dfim.client.fillHole", () => runAction("fillHole", "Fill the hole", false));
  register("dfim.client.toggle", async () => {
    await config().update("inline.enabled", !inlineEnabled(), vscode.ConfigurationTarget.Global);
    renderStatus();
  });
  register("dfim.client.showStats", async () => {
    const lc = requireClient();
    if (!lc) return;
    try {
      const stats = await lc.sendRequest<Record<string, unknown>>(STATS_METHOD, {});
      statsOutput.appendLine(`---- dfim stats ${new Date().toLocaleTimeString()}`);
      statsOutput.appendLine(formatStats(stats ?? {}));
      statsOutput.show(true);
    } catch (err) {
      void vscode.window.showErrorMessage(`dfim: stats failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  });
  register("dfim.client.showCanvas", () => showCanvas(context));
  register("dfim.client.restart", () => restartClient(context));

  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (!e.affectsConfiguration(SECTION)) return;
      if (e.affectsConfiguration("dfim.serverPath") || e.affectsConfiguration("dfim.serverArgs")) {
        await restartClient(context);
        return;
      }
      renderStatus();
      if (client && clientState === "running") {
        await client
          .sendNotification(DidChangeConfigurationNotification.type, { settings: { dfim: currentServerSettings() } })
          .catch(() => undefined);
      }
    }),
    vscode.workspace.onDidChangeTextDocument((e) => {
      const changes: Change[] = e.contentChanges.map((c) => ({
        start: { line: c.range.start.line, character: c.range.start.character },
        rangeLength: c.rangeLength,
        text: c.text,
      }));
      send(watcher.change(e.document.uri.toString(), changes));
    }),
    vscode.window.onDidChangeTextEditorSelection((e) => {
      const active = e.selections[0]?.active;
      if (active) send(watcher.cursor(e.textEditor.document.uri.toString(), { line: active.line, character: active.character }));
    }),
    vscode.workspace.onDidCloseTextDocument((doc) => watcher.closed(doc.uri.toString())),
  );

  renderStatus();
  await startClient(context);
}

/** The server's trace of its last fill in a webview (one panel, reused): scripts on, no local files, and a
 * nonce policy (canvas.ts) so only the page's own style and script blocks run. */
async function showCanvas(context: vscode.ExtensionContext): Promise<void> {
  const lc = requireClient();
  if (!lc) return;
  await showLastCanvas({
    request: (method, params) => lc.sendRequest<LastTrace | null>(method, params),
    show: (title, html) => {
      if (!canvasPanel) {
        canvasPanel = vscode.window.createWebviewPanel("dfim.canvas", title, vscode.ViewColumn.Beside, {
          enableScripts: true,
          enableCommandUris: false,
          localResourceRoots: [],
        });
        canvasPanel.onDidDispose(() => (canvasPanel = undefined), undefined, context.subscriptions);
      }
      canvasPanel.title = title;
      canvasPanel.webview.html = html;
      canvasPanel.reveal(undefined, true);
    },
    info: (message) => void vscode.window.showInformationMessage(message),
    error: (message) => void vscode.window.showErrorMessage(message),
  });
}

export async function deactivate(): Promise<void> {
  const lc = client;
  client = undefined;
  if (lc) await lc.stop().catch(() => undefined);
}
