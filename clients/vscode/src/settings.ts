// Settings: which `dfim.*` keys belong to the server, and the JSON the server gets for them.
//
// The server validates every key it receives and reports unknown ones, so the client must send exactly the
// server's tree (camelCase, nested: `dfim.sampling.maxSteps` -> {sampling: {maxSteps}}) and keep its own
// keys (how to start the server, tracing) to itself. Pure: no `vscode` import, so it is unit-tested in node.

/**
 * The documents the client hands to the server: files, unsaved editors, and the cells of notebooks (Jupyter),
 * each cell a document of its own with its kernel's languageId. The server's `languages` setting decides
 * which languages get completions, for cells as for files.
 */
export const DOCUMENT_SELECTOR: { scheme: string }[] = [
  { scheme: "file" },
  { scheme: "untitled" },
  { scheme: "vscode-notebook-cell" },
];

/** Keys (below `dfim.`) that only the client reads; they are never sent to the server. */
export const CLIENT_ONLY = ["serverPath", "serverArgs", "trace"];

export function isClientOnly(key: string): boolean {
  return CLIENT_ONLY.some((k) => key === k || key.startsWith(`${k}.`));
}

/** The `dfim.*` setting keys (without the prefix) that the manifest declares and the server owns. */
export function serverKeys(manifestProperties: Record<string, unknown>): string[] {
  return Object.keys(manifestProperties)
    .filter((k) => k.startsWith("dfim."))
    .map((k) => k.slice("dfim.".length))
    .filter((k) => !isClientOnly(k))
    .sort();
}

/**
 * The server's settings object from flat keys: `read("sampling.maxSteps")` -> {sampling: {maxSteps: 8}}.
 * Undefined values are left out (the server then keeps what it has); null is sent as null ("leave as is").
 */
export function serverSettings(keys: string[], read: (key: string) => unknown): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key of keys) {
    if (isClientOnly(key)) continue;
    const value = read(key);
    if (value === undefined) continue;
    const parts = key.split(".");
    let node = out;
    for (const part of parts.slice(0, -1)) {
      const next = node[part];
      if (typeof next !== "object" || next === null || Array.isArray(next)) node[part] = {};
      node = node[part] as Record<string, unknown>;
    }
    node[parts[parts.length - 1]] = Array.isArray(value) ? [...value] : value;
  }
  return out;
}

/**
 * Server settings that `dfim serve` also takes on its command line, with the flag: a value VS Code only has
 * as the manifest default (`model.path: ""`, `model.device: "cpu"`) must not override `--model`/`--device`
 * given in `dfim.serverArgs`.
 */
export const CLI_FLAGS: Record<string, string> = { "model.path": "--model", "model.device": "--device" };

/** The value of `flag` in `args` (`--flag V` or `--flag=V`; the last one wins, as in argparse), else undefined. */
export function flagValue(args: unknown, flag: string): string | undefined {
  if (!Array.isArray(args)) return undefined;
  let value: string | undefined;
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (typeof arg !== "string") continue;
    if (arg === flag && typeof args[i + 1] === "string") value = args[++i] as string;
    else if (arg.startsWith(`${flag}=`)) value = arg.slice(flag.length + 1);
  }
  return value;
}

/** What `WorkspaceConfiguration.inspect(key)` returns, the parts read here. */
export interface Inspected {
  defaultValue?: unknown;
  globalValue?: unknown;
  workspaceValue?: unknown;
  workspaceFolderValue?: unknown;
}

/** The value the user set (folder, else workspace, else user settings), or undefined where only the default is. */
export function explicitValue(inspected: Inspected | undefined): unknown {
  if (!inspected) return undefined;
  return inspected.workspaceFolderValue ?? inspected.workspaceValue ?? inspected.globalValue;
}

/**
 * The reader for serverSettings: every key as `get` gives it (the set value, else the default), except the
 * CLI_FLAGS keys: the value set in the settings, else the one `serverArgs` passes on the command line, else the
 * default (what the server has without the flag; sent so that removing a setting takes it back there).
 */
export function settingsReader(
  get: (key: string) => unknown,
  inspect: (key: string) => Inspected | undefined,
  serverArgs: unknown,
): (key: string) => unknown {
  return (key) => {
    const flag = CLI_FLAGS[key];
    if (!flag) return get(key);
    return explicitValue(inspect(key)) ?? flagValue(serverArgs, flag) ?? get(key);
  };
}

export interface ServerCommand {
  command: string;
  args: string[];
}

/** How to start the server: `<serverPath> serve <serverArgs...>`; a blank path means `dfim` on PATH. */
export function serverCommand(serverPath: unknown, serverArgs: unknown): ServerCommand {
  const command = typeof serverPath === "string" && serverPath.trim() !== "" ? serverPath.trim() : "dfim";
  const extra = Array.isArray(serverArgs) ? serverArgs.filter((a): a is string => typeof a === "string") : [];
  return { command: expandHome(command), args: ["serve", ...extra] };
}

function expandHome(path: string): string {
  const home = process.env.HOME ?? process.env.USERPROFILE;
  if (home && (path === "~" || path.startsWith("~/"))) return home + path.slice(1);
  return path;
}
