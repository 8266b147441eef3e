/**
 * The change feed (SPEC §9, §12): `changes` (a page), `watch` (a long poll)
 * and `subscribe` (server-sent events that reconnect by themselves).
 */

import { AgentStateError, fromBody } from "./errors.js";
import type { Http } from "./http.js";
import { checkInt, checkKey, checkKind, parse, type ScopeKind } from "./json.js";
import { toChange, type Change } from "./types.js";
import { ROUTES, type WireChange, type WireChanges, type WireHead } from "./wire.js";

const F = ROUTES.feed;
/** Seconds one long-poll request may wait (the server holds up to 300). */
const LONG_POLL = 25;
/** A stream silent this long is taken for dead (the server sends a keep-alive every 15 s). */
const IDLE_MS = 45_000;
/** The longest pause between two reconnection attempts. */
const MAX_BACKOFF_MS = 1_000;

/** Which changes to see (SPEC §9's filters). */
export interface FeedFilter {
  topic?: "kv" | "run" | "session";
  kind?: ScopeKind;
  scopeId?: string;
  key?: string;
  /** At most this many changes per answer (default: the server's 1000). */
  limit?: number;
}

function filterQuery(f: FeedFilter): Record<string, string | number | undefined> {
  return {
    topic: f.topic,
    kind: f.kind === undefined ? undefined : checkKind(f.kind),
    scope_id: f.scopeId === undefined ? undefined : checkKey(f.scopeId, "scopeId"),
    key: f.key === undefined ? undefined : checkKey(f.key),
    limit: f.limit === undefined ? undefined : checkInt("limit", f.limit, 1),
  };
}

export class Feed {
  /** @internal */
  constructor(private readonly http: Http) {}

  /** The newest change's seq (0 on a new store). */
  async lastChange(): Promise<number> {
    return (await this.http.call<WireHead>(F.head, {})).head;
  }

  /** Changes after `since`, ascending, filtered. :throws CursorExpired */
  async changes(opts: { since?: number } & FeedFilter = {}): Promise<Change[]> {
    const q = { since: checkInt("since", opts.since ?? 0), ...filterQuery(opts) };
    return (await this.http.call<WireChanges>(F.changes, {}, { query: q })).changes.map(toChange);
  }

  /**
   * Like `changes`, but when there is nothing after `since` it waits until a
   * matching change is committed or `timeout` seconds pass (then `[]`; no
   * timeout: it waits as long as it takes). An aborted `signal` rejects it with
   * the signal's reason. :throws CursorExpired
   */
  async watch(since: number, opts: { timeout?: number; signal?: AbortSignal } & FeedFilter = {}): Promise<Change[]> {
    let cursor = checkInt("since", since);
    const flt = filterQuery(opts);
    const deadline = opts.timeout === undefined ? Infinity : Date.now() + Math.max(0, opts.timeout) * 1000;
    for (;;) {
      const wait = Math.min(LONG_POLL, Math.max(0, (deadline - Date.now()) / 1000));
      const d = await this.http.call<WireChanges>(F.changes, {}, {
        query: { since: cursor, wait: Number(wait.toFixed(3)), ...flt }, signal: opts.signal });
      if (d.changes.length > 0) return d.changes.map(toChange);
      cursor = Math.max(cursor, d.last); // past what the server read, shown or not
      if (Date.now() >= deadline) return [];
    }
  }

  /**
   * Every change after `since` (default: from now), as it is committed, for as
   * long as the iteration runs: `for await (const ch of db.subscribe(since, { signal }))`.
   * Over server-sent events; a dropped connection (a restart, a network cut) is
   * reopened from the last change delivered, so none is lost or repeated. Ends
   * when `signal` aborts or the loop breaks. :throws CursorExpired (the changes
   * after the cursor are no longer kept), Unauthorized, InvalidKey
   */
  async *subscribe(since?: number, opts: { signal?: AbortSignal } & FeedFilter = {}): AsyncGenerator<Change, void, undefined> {
    const { signal } = opts;
    const flt = filterQuery(opts);
    let cursor = since === undefined ? await this.lastChange() : checkInt("since", since);
    let backoff = 0;
    while (!signal?.aborted) {
      const conn = new Connection(signal);
      try {
        const res = await this.http.send(F.stream, {}, { query: { since: cursor, ...flt }, signal: conn.signal });
        if (res.body === null) throw new Error("the stream has no body");
        backoff = 0;
        for await (const ev of conn.events(res.body)) {
          const data = parse(ev.data) as WireChange | { error?: unknown };
          if ("error" in data) throw fromBody(410, data, false, false); // the stream's own error event
          const c = data as WireChange;
          if (c.seq <= cursor) continue; // never again what was delivered
          cursor = c.seq;
          yield toChange(c);
        }
        // The server ended the stream (it is stopping): open it again.
      } catch (e) {
        if (signal?.aborted) return;
        if (e instanceof AgentStateError && e.status < 500 && e.code !== "storage_error") throw e;
        // The network, a restart, a busy store: try again, from the cursor.
      } finally {
        conn.close();
      }
      await pause(backoff, signal);
      backoff = Math.min(MAX_BACKOFF_MS, Math.max(50, backoff * 2));
    }
  }
}

/** One stream request: aborted with the caller's signal, when idle too long, or when closed. */
class Connection {
  private readonly ctrl = new AbortController();
  private timer: ReturnType<typeof setTimeout> | undefined;
  private readonly onAbort = () => this.ctrl.abort();

  constructor(private readonly outer: AbortSignal | undefined) {
    outer?.addEventListener("abort", this.onAbort, { once: true });
    this.alive();
  }

  get signal(): AbortSignal {
    return this.ctrl.signal;
  }

  private alive(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.ctrl.abort(), IDLE_MS);
  }

  close(): void {
    clearTimeout(this.timer);
    this.outer?.removeEventListener("abort", this.onAbort);
    this.ctrl.abort(); // lets the connection go if the loop left early
  }

  /** The events of a text/event-stream body (the WHATWG rules: data, id, event, comments). */
  async *events(body: ReadableStream<Uint8Array>): AsyncGenerator<{ type: string; data: string }> {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    const parser = new EventParser();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        this.alive();
        yield* parser.push(decoder.decode(value, { stream: true }));
      }
    } finally {
      reader.cancel().catch(() => undefined);
    }
  }
}

/** Lines to events; a line may end with CR, LF or CRLF, split anywhere between chunks. */
export class EventParser {
  private buf = "";
  private cr = false;
  private data: string[] = [];
  private type = "";

  push(chunk: string): { type: string; data: string }[] {
    if (this.cr && chunk.startsWith("\n")) chunk = chunk.slice(1);
    if (chunk === "") return [];
    this.cr = chunk.endsWith("\r");
    const lines = (this.buf + chunk).split(/\r\n|\r|\n/);
    this.buf = lines.pop() ?? "";
    const out: { type: string; data: string }[] = [];
    for (const line of lines) {
      if (line === "") {
        if (this.data.length) out.push({ type: this.type || "message", data: this.data.join("\n") });
        this.data = [];
        this.type = "";
        continue;
      }
      if (line.startsWith(":")) continue; // a comment: the greeting, a keep-alive
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") this.data.push(value);
      else if (field === "event") this.type = value;
    }
    return out;
  }
}

function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted || ms <= 0) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
