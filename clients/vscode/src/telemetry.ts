// Shown / accepted / partially accepted / rejected: the client's half of the server's local telemetry.
//
// The server records `shown` when it answers and `accepted` when VS Code runs the item's command
// (`dfim.inlineAccepted`) after a full accept. VS Code has no stable hook for a partial accept (accept word /
// accept line) or a dismissal, so this watcher infers them from edits and cursor moves and returns the
// notifications to send. Typing the suggestion character by character is left to the server (its
// typed-ahead reuse already counts it). Pure: no `vscode` import.

export const ACCEPT_COMMAND = "dfim.inlineAccepted";
export const PARTIAL_METHOD = "dfim/inlinePartiallyAccepted";
export const REJECT_METHOD = "dfim/inlineRejected";

export interface Position {
  line: number;
  character: number;
}

export interface TelemetryEvent {
  method: typeof PARTIAL_METHOD | typeof REJECT_METHOD;
  params: { id: string; acceptedLength?: number };
}

/** One content change as VS Code reports it (range start, replaced length, inserted text). */
export interface Change {
  start: Position;
  rangeLength: number;
  text: string;
}

interface Tracked {
  id: string;
  uri: string;
  pos: Position; // where the not-yet-taken rest of the suggestion starts
  rest: string;
  accepted: number; // characters taken so far (partial accepts and typing)
  reported: boolean; // a partial accept was already sent
}

/** The suggestion id an inline item carries: the first argument of its accept command. */
export function suggestionId(command: { command?: string; arguments?: unknown[] } | undefined): string | undefined {
  if (!command || command.command !== ACCEPT_COMMAND || !command.arguments?.length) return undefined;
  const id = command.arguments[0];
  return typeof id === "string" ? id : undefined;
}

export function advance(pos: Position, text: string): Position {
  const lines = text.split(/\r\n|\r|\n/);
  if (lines.length === 1) return { line: pos.line, character: pos.character + text.length };
  return { line: pos.line + lines.length - 1, character: lines[lines.length - 1].length };
}

function samePos(a: Position, b: Position): boolean {
  return a.line === b.line && a.character === b.character;
}

export class SuggestionWatcher {
  private current: Tracked | undefined;

  /** The first item of a fresh answer is what the user sees. Same id again: the server's typed-ahead rest. */
  shown(uri: string, id: string | undefined, start: Position, insertText: string): TelemetryEvent[] {
    if (id === undefined) return [];
    const cur = this.current;
    if (cur && cur.id === id && cur.uri === uri) {
      cur.pos = start;
      cur.rest = insertText;
      return [];
    }
    const events = this.end();
    this.current = { id, uri, pos: start, rest: insertText, accepted: 0, reported: false };
    return events;
  }

  /** VS Code ran the accept command: the server records it; nothing more to say. */
  accepted(id: string): void {
    if (this.current?.id === id) this.current = undefined;
  }

  change(uri: string, changes: readonly Change[]): TelemetryEvent[] {
    const cur = this.current;
    if (!cur || cur.uri !== uri || changes.length === 0) return [];
    if (changes.length === 1) {
      const c = changes[0];
      if (c.rangeLength === 0 && samePos(c.start, cur.pos) && c.text.length > 0 && cur.rest.startsWith(c.text)) {
        cur.accepted += c.text.length;
        cur.pos = advance(cur.pos, c.text);
        cur.rest = cur.rest.slice(c.text.length);
        if (cur.rest.length === 0) {
          // All of it is in: by partial accepts (report the total) or by typing (the server saw it).
          const events = cur.reported || c.text.length > 1 ? [partial(cur)] : [];
          this.current = undefined;
          return events;
        }
        if (c.text.length > 1) {
          // more than one character at once at the suggestion's start: accept word / accept line
          cur.reported = true;
          return [partial(cur)];
        }
        return [];
      }
    }
    return this.end();
  }

  /** The cursor moved: anywhere but the suggestion's start ends it. */
  cursor(uri: string, pos: Position): TelemetryEvent[] {
    const cur = this.current;
    if (!cur || (cur.uri === uri && samePos(pos, cur.pos))) return [];
    return this.end();
  }

  closed(uri: string): void {
    if (this.current?.uri === uri) this.current = undefined;
  }

  /** The suggestion's life is over without a full accept. */
  end(): TelemetryEvent[] {
    const cur = this.current;
    this.current = undefined;
    if (!cur || cur.reported) return [];
    if (cur.accepted > 0) return []; // typed part of it: the server's typed-ahead tracking reports that
    return [{ method: REJECT_METHOD, params: { id: cur.id } }];
  }
}

function partial(cur: Tracked): TelemetryEvent {
  return { method: PARTIAL_METHOD, params: { id: cur.id, acceptedLength: cur.accepted } };
}
