// "Show Denoising Canvas of the Last Fill": the server's `dfim/lastTrace` page (the same view `dfim trace`
// writes) in a webview. Pure (no `vscode` import): `extension.ts` supplies the client and the panel.

import { randomBytes } from "node:crypto";

export const LAST_TRACE_METHOD = "dfim/lastTrace";

/** Result of `dfim/lastTrace` (server/trace_feature.py); null before the server's first fill. */
export interface LastTrace {
  html: string;
  fill: string;
  steps: number;
  frames: number;
  latencyMs: number;
  stopReason: string;
  model: string;
  randomModel: boolean;
}

/** What showing the canvas needs from the editor; `extension.ts` fills it with the real client and panel. */
export interface CanvasHost {
  request(method: string, params: { nonce: string }): Promise<LastTrace | null>;
  show(title: string, html: string): void;
  info(message: string): void;
  error(message: string): void;
}

/** 24 characters of base64url (A-Z a-z 0-9 - _): a fresh nonce for every page shown. */
export function makeNonce(): string {
  return randomBytes(18).toString("base64url");
}

/** The webview's policy: nothing loads, and only the style and script blocks carrying `nonce` run. */
export function webviewPolicy(nonce: string): string {
  return `default-src 'none'; style-src 'nonce-${nonce}'; script-src 'nonce-${nonce}'`;
}

/** The server's page with the client's own policy as the first thing in <head>. A document obeys every
 * policy it declares, so whatever the page itself declares can only narrow this one, never widen it. */
export function webviewHtml(page: string, nonce: string): string {
  const meta = `<meta http-equiv="Content-Security-Policy" content="${webviewPolicy(nonce)}">`;
  const head = /<head(\s[^>]*)?>/i.exec(page);
  if (head) {
    const at = head.index + head[0].length;
    return page.slice(0, at) + meta + page.slice(at);
  }
  return `<!DOCTYPE html><html><head>${meta}</head><body>${page}</body></html>`;
}

export function canvasTitle(trace: LastTrace): string {
  return `dfim canvas: ${trace.steps} steps, ${Math.round(trace.latencyMs)} ms`;
}

/** Ask the server for its last fill's page and show it; what happened, for callers and tests. */
export async function showLastCanvas(host: CanvasHost): Promise<"shown" | "none" | "failed"> {
  const nonce = makeNonce();
  let trace: LastTrace | null;
  try {
    trace = await host.request(LAST_TRACE_METHOD, { nonce });
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    host.error(
      /method not found|unhandled method/i.test(message)
        ? "dfim: this server does not record fills (update dfim)."
        : `dfim: could not get the canvas: ${message.replace(/^dfim: /, "")}`,
    );
    return "failed";
  }
  if (!trace || typeof trace.html !== "string") {
    host.info("dfim: no fill yet. Type to get an inline completion, or run a dfim command, then try again.");
    return "none";
  }
  host.show(canvasTitle(trace), webviewHtml(trace.html, nonce));
  return "shown";
}
