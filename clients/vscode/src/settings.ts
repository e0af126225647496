// Settings: which `dfim.*` keys belong to the server, and the JSON the server gets for them.
//
// The server validates every key it receives and reports unknown ones, so the client must send exactly the
// server's tree (camelCase, nested: `dfim.sampling.maxSteps` -> {sampling: {maxSteps}}) and keep its own
// keys (how to start the server, tracing) to itself. Pure: no `vscode` import, so it is unit-tested in node.

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
 * The server's settings object from flat keys: `read("sampling.maxSteps")` -> {sampling: {maxSteps: 16}}.
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
