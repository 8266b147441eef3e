/**
 * The change feed (SPEC §9, §12): `changes` (a page), `watch` (a long poll)
 * and `subscribe` (server-sent events that reconnect by themselves).
 */

import { AgentStateError, fromBody } from "./errors.js";
import { answerStatus, type Http } from "./http.js";
import { checkInt, checkKey, checkKind, parse, type ScopeKind } from "./json.js";
import { toChange, type Change } from "./types.js";
import { ROUTES, type WireChange, type WireChanges, type WireHead } from "./wire.js";

const F = ROUTES.feed;
/** Seconds one long-poll request may wait (the server holds up to 300). */
const LONG_POLL = 25;
/** A stream silent this long is taken for dead (the server sends a keep-alive every 15 s). */
const IDLE_MS = 45_000;
/**
 * The pauses between reconnections: none after a stream that delivered a change, then from
 * MIN doubling up to MAX (each drawn from its upper half, so that subscribers cut off together
 * do not come back together) while the streams deliver nothing: a stream that ends at once
 * (the server ends it on purpose while the store is busy) is not reopened in a tight loop.
 */
const MIN_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 2_000;

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
      const wait = Number(Math.min(LONG_POLL, Math.max(0, (deadline - Date.now()) / 1000)).toFixed(3));
      const d = await this.http.call<WireChanges>(F.changes, {}, {
        query: { since: cursor, wait, ...flt }, signal: opts.signal, wait });
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
    let backoff = 0; // the pause before the next reconnection
    while (!signal?.aborted) {
      const conn = new Connection(signal);
      try {
        const body = await this.http.stream(F.stream, {}, { query: { since: cursor, ...flt }, signal: conn.signal });
        for await (const ev of conn.events(body)) {
          if (ev.data === null) {
            // An event with only an id: the server read up to there, past changes the filters
            // (or the session rule) left out; reopened from there, it does not read them again.
            const id = seqOf(ev.id);
            if (id !== undefined && id > cursor) cursor = id;
            continue;
          }
          const data = parse(ev.data) as WireChange | { error?: unknown };
          if ("error" in data) throw fromBody(410, data, false, false); // the stream's own error event
          const c = data as WireChange;
          if (c.seq <= cursor) continue; // never again what was delivered
          cursor = c.seq;
          backoff = 0; // the stream works: the next cut is reopened at once
          yield toChange(c);
        }
        // The server ended the stream (it is stopping, or the store is busy): open it again.
      } catch (e) {
        if (signal?.aborted) return;
        if (!retried(e)) throw e;
        // The network, a restart, a busy store, a gateway's 5xx: try again, from the cursor.
      } finally {
        conn.close();
      }
      await pause(backoff / 2 + Math.random() * (backoff / 2), signal);
      backoff = Math.min(MAX_BACKOFF_MS, Math.max(MIN_BACKOFF_MS, backoff * 2));
    }
  }
}

/**
 * Whether a failed stream is opened again. An answer other than a 5xx (or 408, 429) will not
 * change by asking again: a redirect, agentstate's own 4xx (Unauthorized, InvalidKey,
 * CursorExpired) or another server's (a wrong base URL's 404, a proxy's 403) is thrown.
 * Of the stream's own error events, cursor_expired and unauthorized are thrown, busy and
 * storage_error retried; a request with no answer (the network, a restart) is retried.
 */
function retried(e: unknown): boolean {
  const status = answerStatus(e);
  if (status !== undefined) return status >= 500 || status === 408 || status === 429;
  if (e instanceof AgentStateError) return e.status >= 500 || e.code === "storage_error";
  return true;
}

/** An event's id as a seq, if it is one. */
function seqOf(id: string): number | undefined {
  if (!/^[0-9]{1,15}$/.test(id)) return undefined;
  return Number(id);
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
  async *events(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
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

/**
 * One event: its type, its data (null: an event with no data, given for its id), and the last
 * event id (WHATWG's: the latest `id:` field of this event or an earlier one).
 */
export interface SseEvent { type: string; data: string | null; id: string }

/** Lines to events; a line may end with CR, LF or CRLF, split anywhere between chunks. */
export class EventParser {
  private buf = "";
  private cr = false;
  private data: string[] = [];
  private type = "";
  private id = "";
  private idSeen = false; // this event has an id field

  push(chunk: string): SseEvent[] {
    if (this.cr && chunk.startsWith("\n")) chunk = chunk.slice(1);
    if (chunk === "") return [];
    this.cr = chunk.endsWith("\r");
    const lines = (this.buf + chunk).split(/\r\n|\r|\n/);
    this.buf = lines.pop() ?? "";
    const out: SseEvent[] = [];
    for (const line of lines) {
      if (line === "") {
        if (this.data.length || this.idSeen) {
          out.push({ type: this.type || "message", data: this.data.length ? this.data.join("\n") : null, id: this.id });
        }
        this.data = [];
        this.type = "";
        this.idSeen = false;
        continue;
      }
      if (line.startsWith(":")) continue; // a comment: the greeting, a keep-alive
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") this.data.push(value);
      else if (field === "event") this.type = value;
      else if (field === "id" && !value.includes("\0")) {
        this.id = value;
        this.idSeen = true;
      }
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
