// The status bar item: what the server's `dfim/status` notification says, as text, tooltip and severity.
// Pure (no `vscode` import); `extension.ts` puts the result on a StatusBarItem.

export const STATUS_METHOD = "dfim/status";

/** Params of `dfim/status` (server/status.py). Every field may be missing from an older server. */
export interface ServerStatus {
  state?: "loading" | "ready" | "busy" | "error" | string;
  message?: string;
  model?: string;
  device?: string;
  isRandom?: boolean;
  lastLatencyMs?: number | null;
  lastSteps?: number | null;
  lastStopReason?: string | null;
  lastHidden?: string | null; // why the confidence gate hid the last inline suggestion; null once one shows
}

/** What the client itself knows: the server process may be missing or stopped before any status arrives. */
export type ClientState = "starting" | "running" | "stopped" | "failed";

export interface StatusView {
  text: string; // with $(codicon) references
  tooltip: string;
  severity: "normal" | "warning" | "error";
}

export function formatLatency(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(1)} s`;
}

function stepsText(n: number): string {
  return `${n} step${n === 1 ? "" : "s"}`;
}

export function formatStatus(
  status: ServerStatus | undefined,
  enabled: boolean,
  client: ClientState = "running",
  clientError = "",
): StatusView {
  if (client === "failed") {
    return {
      text: "$(error) dfim",
      tooltip: `dfim: the server could not start. ${clientError}`.trim() + "\nSet dfim.serverPath to the dfim command.",
      severity: "error",
    };
  }
  if (client === "stopped") return { text: "$(debug-stop) dfim", tooltip: "dfim: the server is stopped", severity: "warning" };
  const s = status ?? {};
  const lines: string[] = [];
  if (s.model) lines.push(`model: ${s.model}${s.isRandom ? " (untrained test checkpoint)" : ""}`);
  if (s.device) lines.push(`device: ${s.device}`);
  const latency = formatLatency(s.lastLatencyMs);
  if (latency) {
    const steps = s.lastSteps ?? undefined;
    const why = s.lastStopReason ? `, stopped: ${s.lastStopReason}` : "";
    lines.push(`last fill: ${latency}${steps !== undefined ? `, ${stepsText(steps)}` : ""}${why}`);
  }
  if (s.lastHidden) {
    lines.push(`last suggestion hidden by the confidence gate (${s.lastHidden}); Alt+\\ asks for it anyway`);
  }
  if (s.message) lines.push(s.message);
  lines.push(enabled ? "inline completions: on (click to turn off)" : "inline completions: off (click to turn on)");
  const tooltip = lines.join("\n");

  let text: string;
  let severity: StatusView["severity"] = "normal";
  switch (client === "starting" && !s.state ? "loading" : s.state) {
    case "loading":
      text = "$(sync~spin) dfim";
      break;
    case "busy":
      text = "$(loading~spin) dfim";
      break;
    case "error":
      text = "$(error) dfim";
      severity = "error";
      break;
    case "ready":
    default: {
      const last = [latency, s.lastSteps !== null && s.lastSteps !== undefined ? stepsText(s.lastSteps) : ""]
        .filter(Boolean)
        .join(" · ");
      text = `$(sparkle) dfim${last ? ` ${last}` : ""}${s.lastHidden ? " · hidden" : ""}`;
      if (s.isRandom) severity = "warning";
    }
  }
  if (!enabled) {
    text = "$(circle-slash) dfim";
    if (severity === "normal") severity = "warning";
  }
  return { text, tooltip, severity };
}

/** `dfim/stats` (server/app.py) as lines of text for the output channel. */
export function formatStats(stats: Record<string, unknown>): string {
  const lines: string[] = [];
  const status = (stats.status ?? {}) as ServerStatus;
  for (const [key, value] of Object.entries(stats)) {
    if (key === "status" || typeof value === "object") continue;
    lines.push(`${key.padEnd(24)} ${String(value)}`);
  }
  lines.push("");
  lines.push(`state                    ${status.state ?? "?"}${status.message ? ` (${status.message})` : ""}`);
  if (status.model) lines.push(`model                    ${status.model}${status.isRandom ? " (random)" : ""}`);
  const latency = formatLatency(status.lastLatencyMs);
  if (latency) lines.push(`last fill                ${latency}, ${status.lastSteps ?? "?"} steps, ${status.lastStopReason ?? "?"}`);
  lines.push("", "Acceptance rate and latency percentiles: run `dfim stats` in a terminal.");
  return lines.join("\n");
}

/** Whether a `dfim/status` turned the model ready: from nothing, loading or error (not from busy, which is
 * ready with a fill running). The extension then asks for the inline suggestion again: one asked during the
 * load and answered empty past the server's `inline.waitForModelMs` would otherwise wait for the next
 * keystroke. */
export function becameReady(previous: ServerStatus | undefined, next: ServerStatus): boolean {
  const was = previous?.state;
  return next.state === "ready" && was !== "ready" && was !== "busy";
}

/** `message` with one `dfim: ` in front: the server's own messages already start with it. */
export function prefixed(message: string): string {
  return message.startsWith("dfim: ") ? message : `dfim: ${message}`;
}
