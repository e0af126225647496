import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import {
  CLIENT_ONLY,
  DOCUMENT_SELECTOR,
  explicitValue,
  flagValue,
  Inspected,
  isClientOnly,
  serverCommand,
  serverKeys,
  serverSettings,
  settingsReader,
} from "../settings";

const manifest = JSON.parse(readFileSync(join(__dirname, "..", "..", "package.json"), "utf8"));
const properties: Record<string, { default: unknown }> = manifest.contributes.configuration.properties;

test("client-only keys never reach the server", () => {
  const keys = serverKeys(properties);
  assert.ok(keys.length > 10);
  for (const key of keys) assert.ok(!isClientOnly(key), key);
  for (const key of ["serverPath", "serverArgs", "trace.server"]) assert.ok(isClientOnly(key), key);
  assert.ok(!isClientOnly("tracer"));
  const out = serverSettings(["serverPath", "trace.server", "inline.enabled"], () => "x");
  assert.deepEqual(out, { inline: { enabled: "x" } });
});

test("every declared server key is nested camelCase under its group", () => {
  const keys = serverKeys(properties);
  const defaults = serverSettings(keys, (k) => properties[`dfim.${k}`].default);
  assert.deepEqual(Object.keys(defaults).sort(), ["actions", "context", "inline", "languages", "model", "sampling", "telemetry"]);
  assert.equal((defaults.sampling as Record<string, unknown>).maxSteps, 8);
  assert.equal((defaults.model as Record<string, unknown>).path, "");
  assert.deepEqual(defaults.languages, ["*"]);
  for (const key of keys) assert.match(key, /^[a-z]+(\.[a-z][A-Za-z]*)*$/, key);
});

test("undefined values are left out, null and falsy values are kept", () => {
  const values: Record<string, unknown> = {
    "sampling.maxSteps": 4,
    "sampling.seed": 0,
    "inline.enabled": false,
    "model.path": null,
    "context.prefixTokens": undefined,
  };
  const out = serverSettings(Object.keys(values), (k) => values[k]);
  assert.deepEqual(out, { sampling: { maxSteps: 4, seed: 0 }, inline: { enabled: false }, model: { path: null } });
});

test("arrays are copied, not shared with the configuration object", () => {
  const langs = ["python"];
  const out = serverSettings(["languages"], () => langs);
  (out.languages as string[]).push("go");
  assert.deepEqual(langs, ["python"]);
});

test("the server command: dfim serve by default, a configured path, extra args", () => {
  assert.deepEqual(serverCommand(undefined, undefined), { command: "dfim", args: ["serve"] });
  assert.deepEqual(serverCommand("  ", []), { command: "dfim", args: ["serve"] });
  assert.deepEqual(serverCommand("/opt/dfim/bin/dfim", ["--device", "cuda", 3]), {
    command: "/opt/dfim/bin/dfim",
    args: ["serve", "--device", "cuda"],
  });
  const home = process.env.HOME;
  process.env.HOME = "/home/u";
  try {
    assert.equal(serverCommand("~/.venv/bin/dfim", []).command, "/home/u/.venv/bin/dfim");
  } finally {
    process.env.HOME = home;
  }
});

test("CLIENT_ONLY keys are declared in the manifest", () => {
  for (const key of CLIENT_ONLY) {
    assert.ok(Object.keys(properties).some((p) => p === `dfim.${key}` || p.startsWith(`dfim.${key}.`)), key);
  }
});

test("every contributed command is handled by a client id (never a server command id)", () => {
  const source = readFileSync(join(__dirname, "..", "..", "src", "extension.ts"), "utf8");
  for (const { command } of manifest.contributes.commands) {
    assert.match(command, /^dfim\.client\./, command);
    assert.ok(source.includes(`"${command}"`), `${command} is not registered in extension.ts`);
  }
});

/** A configuration like VS Code's: `user`/`workspace`/`folder` values over the manifest defaults. */
function fakeConfig(levels: { user?: Record<string, unknown>; workspace?: Record<string, unknown>; folder?: Record<string, unknown> }) {
  const inspect = (key: string): Inspected => ({
    defaultValue: properties[`dfim.${key}`]?.default,
    globalValue: levels.user?.[key],
    workspaceValue: levels.workspace?.[key],
    workspaceFolderValue: levels.folder?.[key],
  });
  const get = (key: string): unknown => {
    const i = inspect(key);
    return i.workspaceFolderValue ?? i.workspaceValue ?? i.globalValue ?? i.defaultValue;
  };
  return { get, inspect };
}

function modelOf(levels: Parameters<typeof fakeConfig>[0]): unknown {
  const cfg = fakeConfig(levels);
  const read = settingsReader(cfg.get, cfg.inspect, cfg.get("serverArgs"));
  return serverSettings(serverKeys(properties), read).model;
}

test("--model/--device in serverArgs are not overridden by the defaults of model.path/model.device", () => {
  // nothing set anywhere: the defaults (what `dfim serve` has without flags)
  assert.deepEqual(modelOf({}), { path: "", device: "cpu", fast: true, compile: false });
  // flags only: the server keeps them
  assert.deepEqual(modelOf({ user: { serverArgs: ["--model", "/ckpt", "--device", "cuda"] } }), {
    path: "/ckpt",
    device: "cuda",
    fast: true,
    compile: false,
  });
  assert.deepEqual(modelOf({ workspace: { serverArgs: ["--model=/a", "--device=cuda", "--model=/b"] } }), {
    path: "/b",
    device: "cuda",
    fast: true,
    compile: false,
  });
  // a value set in the settings, at any level, wins over the flag; the folder's over the workspace's and the user's
  assert.deepEqual(
    modelOf({ user: { serverArgs: ["--model", "/ckpt", "--device", "cuda"], "model.device": "cpu" } }),
    { path: "/ckpt", device: "cpu", fast: true, compile: false },
  );
  assert.deepEqual(
    modelOf({ user: { "model.path": "/u" }, workspace: { "model.path": "/w" }, folder: { "model.path": "/f" } }),
    { path: "/f", device: "cpu", fast: true, compile: false },
  );
  // set explicitly to the default value is still set: "" = the shipped model, even with --model given
  assert.deepEqual(modelOf({ user: { serverArgs: ["--model", "/ckpt"] }, workspace: { "model.path": "" } }), {
    path: "",
    device: "cpu",
    fast: true,
    compile: false,
  });
  // other keys are read as before
  const cfg = fakeConfig({ user: { "sampling.maxSteps": 8 } });
  const read = settingsReader(cfg.get, cfg.inspect, []);
  assert.equal(read("sampling.maxSteps"), 8);
  assert.equal(read("context.prefixTokens"), properties["dfim.context.prefixTokens"].default);
});

test("flagValue and explicitValue", () => {
  assert.equal(flagValue(undefined, "--model"), undefined);
  assert.equal(flagValue(["--log-file", "/tmp/x"], "--model"), undefined);
  assert.equal(flagValue(["--model"], "--model"), undefined); // no value after it
  assert.equal(flagValue(["--model", "/a", 3, "--modelx", "/b"], "--model"), "/a");
  assert.equal(flagValue(["--device=cuda"], "--device"), "cuda");
  assert.equal(explicitValue(undefined), undefined);
  assert.equal(explicitValue({ defaultValue: "cpu" }), undefined);
  assert.equal(explicitValue({ defaultValue: "cpu", globalValue: "cuda" }), "cuda");
  assert.equal(explicitValue({ globalValue: "cuda", workspaceValue: "cpu" }), "cpu");
});

test("files, unsaved editors and notebook cells go to the server", () => {
  const schemes = DOCUMENT_SELECTOR.map((filter) => filter.scheme);
  assert.deepEqual(schemes, ["file", "untitled", "vscode-notebook-cell"]);
  // no language filter: the server's `languages` setting decides, for cells as for files
  assert.ok(DOCUMENT_SELECTOR.every((filter) => Object.keys(filter).length === 1));
});
