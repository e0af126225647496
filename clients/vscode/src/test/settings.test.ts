import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { CLIENT_ONLY, isClientOnly, serverCommand, serverKeys, serverSettings } from "../settings";

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
  assert.equal((defaults.sampling as Record<string, unknown>).maxSteps, 16);
  assert.equal((defaults.model as Record<string, unknown>).path, "");
  assert.deepEqual(defaults.languages, ["*"]);
  for (const key of keys) assert.match(key, /^[a-z]+(\.[a-z][A-Za-z]*)?$/, key);
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
