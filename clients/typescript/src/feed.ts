/**
 * The change feed (SPEC §9, §12): `changes` (a page), `watch` (a long poll)
 * and `subscribe` (server-sent events that reconnect by themselves). All the
 * subscriptions of one client share one stream (a browser allows six
 * connections per host, SPEC §16): the stream carries every change the token
 * may read, and each subscription takes those its filters match.
 */

import { AgentStateError, InvalidValue, StorageError, fromBody } from "./errors.js";
import { answerStatus, type Http } from "./http.js";
import { checkInt, checkKey, checkKind, parse, show, type ScopeKind } from "./json.js";
import { toChange, type Change } from "./types.js";
import { ROUTES, type WireChange, type WireChanges, type WireHead } from "./wire.js";

const F = ROUTES.feed;
/** Seconds one long-poll request may wait (the server holds up to 300). */
const LONG_POLL = 25;
/** A stream silent this long is taken for dead (the server sends a keep-alive every 15 s). */
const IDLE_MS = 45_000;
/**
 * The pauses between reconnections: none after a stream that worked, then from MIN doubling
 * up to MAX (each drawn from its upper half, so that subscribers cut off together do not come
 * back together) while the streams fail: a stream that ends at once (the server ends it on
 * purpose while the store is busy) is not reopened in a tight loop.
 */
const MIN_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 2_000;
/**
 * A stream that keeps failing — no answer, a 5xx, ended before it delivered anything — is
 * given up after this many attempts in a row that also span the client's timeout: the
 * subscriptions end with the last error (SPEC §16), as Python's `awatch` does.
 */
const MAX_FAILURES = 8;
/**
 * Changes one subscription may hold that its loop has not taken yet; past that they are
 * dropped and read again later by pages, so a slow loop neither holds the stream up for the
 * others nor makes the client's memory grow.
 */
const MAX_QUEUE = 10_000;
const TOPICS = ["kv", "run", "session"] as const;

/** Which changes to see (SPEC §9's filters). */
export interface FeedFilter {
  topic?: "kv" | "run" | "session";
  kind?: ScopeKind;
  scopeId?: string;
  key?: string;
  /** At most this many changes per answer (default: the server's 1000). */
  limit?: number;
}

/** The filters, checked, as the query parameters of the feed's routes. */
function filterQuery(f: FeedFilter): { topic?: string; kind?: ScopeKind; scope_id?: string; key?: string; limit?: number } {
  if (f.topic !== undefined && !(TOPICS as readonly unknown[]).includes(f.topic)) {
    throw new InvalidValue(`topic must be one of ${TOPICS.join(", ")}, got ${show(f.topic)}`);
  }
  return {
    topic: f.topic,
    kind: f.kind === undefined ? undefined : checkKind(f.kind),
    scope_id: f.scopeId === undefined ? undefined : checkKey(f.scopeId, "scopeId"),
    key: f.key === undefined ? undefined : checkKey(f.key),
    limit: f.limit === undefined ? undefined : checkInt("limit", f.limit, 1),
  };
}

type Query = ReturnType<typeof filterQuery>;

/** Whether a change passes the filters: each one given equals the change's field (the server's rule). */
function matches(c: WireChange, q: Query): boolean {
  return (q.topic === undefined || c.topic === q.topic) && (q.kind === undefined || c.kind === q.kind) &&
    (q.scope_id === undefined || c.scope_id === q.scope_id) && (q.key === undefined || c.key === q.key);
}

export class Feed {
  /** The stream that the subscriptions share, while there are some. */
  private hub: Hub | null = null;

  /** @internal */
  constructor(private readonly http: Http) {}

  /** The newest change's seq (0 on a new store). */
  async lastChange(): Promise<number> {
    return (await this.http.call<WireHead>(F.head, {})).head;
  }

  private page(since: number, q: Query, signal?: AbortSignal): Promise<WireChanges> {
    return this.http.call<WireChanges>(F.changes, {}, { query: { since, ...q }, signal });
  }

  /**
   * Changes after `since`, ascending, filtered; [] when there are none up to the head.
   * The server leaves out what this token may not see and says how far it read: a page
   * with none to show is asked on from there (as Python's client does), so a run of
   * changes the caller may not see never reads as the end. :throws CursorExpired
   */
  async changes(opts: { since?: number } & FeedFilter = {}): Promise<Change[]> {
    let cursor = checkInt("since", opts.since ?? 0);
    const q = filterQuery(opts);
    for (;;) {
      const d = await this.page(cursor, q);
      if (d.changes.length > 0 || d.last <= cursor) return d.changes.map(toChange);
      cursor = d.last;
    }
  }

  /**
   * Like `changes`, but when there is nothing after `since` it waits until a
   * matching change is committed or `timeout` seconds pass (then `[]`; no
   * timeout: it waits as long as it takes). An aborted `signal` rejects it with
   * the signal's reason. :throws CursorExpired
   */
  async watch(since: number, opts: { timeout?: number; signal?: AbortSignal } & FeedFilter = {}): Promise<Change[]> {
    let cursor = checkInt("since", since);
    const q = filterQuery(opts);
    const deadline = opts.timeout === undefined ? Infinity : Date.now() + Math.max(0, opts.timeout) * 1000;
    for (;;) {
      const wait = Number(Math.min(LONG_POLL, Math.max(0, (deadline - Date.now()) / 1000)).toFixed(3));
      const d = await this.http.call<WireChanges>(F.changes, {}, {
        query: { since: cursor, wait, ...q }, signal: opts.signal, wait });
      if (d.changes.length > 0) return d.changes.map(toChange);
      cursor = Math.max(cursor, d.last); // past what the server read, shown or not
      if (Date.now() >= deadline) return [];
    }
  }

  /**
   * Every change after `since` (default: from now), as it is committed, for as
   * long as the iteration runs: `for await (const ch of db.subscribe(since, { signal }))`.
   * Over server-sent events, one stream for all of this client's subscriptions; a dropped
   * connection (a restart, a network cut) is reopened from the last change read, so none
   * is lost or repeated. Ends when `signal` aborts or the loop breaks.
   * :throws CursorExpired (the changes after the cursor are no longer kept), Unauthorized,
   * InvalidKey, StorageError or Busy (a stream that keeps failing, after some attempts)
   */
  async *subscribe(since?: number, opts: { signal?: AbortSignal } & FeedFilter = {}): AsyncGenerator<Change, void, undefined> {
    const { signal } = opts;
    const q = filterQuery(opts);
    let cursor = since === undefined ? await this.lastChange() : checkInt("since", since);
    if (signal?.aborted) return;
    const sub = new Subscription(q);
    if (this.hub === null) {
      const hub = new Hub(this.http, cursor, () => { if (this.hub === hub) this.hub = null; });
      this.hub = hub;
    }
    const hub = this.hub;
    // What the stream reads from here on reaches this subscription; what it read before, the
    // subscription reads by pages (the stream may be ahead of `since`).
    if (hub.cursor > cursor) sub.push({ upto: hub.cursor });
    hub.join(sub);
    try {
      for (;;) {
        const item = await sub.next(signal);
        if (item === null) return;
        if ("error" in item) throw item.error;
        if ("upto" in item) {
          for await (const c of this.catchUp(cursor, item.upto, q, signal)) {
            cursor = c.seq;
            yield toChange(c);
          }
          if (signal?.aborted) return;
          cursor = Math.max(cursor, item.upto);
        } else if (item.change.seq > cursor) {
          cursor = item.change.seq;
          yield toChange(item.change);
        }
      }
    } finally {
      hub.leave(sub);
    }
  }

  /** The changes after `cursor` up to and including `upto` that the filters match, by pages. */
  private async *catchUp(cursor: number, upto: number, q: Query, signal: AbortSignal | undefined):
    AsyncGenerator<WireChange, void, undefined> {
    while (cursor < upto) {
      let d: WireChanges;
      try {
        d = await this.page(cursor, q, signal);
      } catch (e) {
        if (signal?.aborted) return;
        throw e;
      }
      for (const c of d.changes) {
        if (c.seq > upto) return;
        if (c.seq > cursor) {
          cursor = c.seq;
          yield c;
        }
      }
      if (d.changes.length === 0 && d.last <= cursor) return; // the head (a purge passed upto)
      cursor = Math.max(cursor, d.last);
    }
  }
}

/** What the stream hands a subscription: a change, "read up to here by pages", or the end. */
type Item = { change: WireChange } | { upto: number } | { error: unknown };

/** One `subscribe`: its filters and what the stream read for it that its loop has not taken. */
class Subscription {
  private queue: Item[] = [];
  private wake: (() => void) | null = null;

  constructor(readonly query: Query) {}

  push(item: Item): void {
    if (this.queue.length >= MAX_QUEUE && "change" in item) {
      // Too far behind: read what is dropped again later, by pages, up to this change.
      this.queue = this.queue.filter((i) => "error" in i);
      this.queue.unshift({ upto: item.change.seq });
    } else {
      this.queue.push(item);
    }
    this.wake?.();
  }

  /** The next item; null once `signal` aborts. */
  async next(signal: AbortSignal | undefined): Promise<Item | null> {
    while (this.queue.length === 0) {
      if (signal?.aborted) return null;
      await new Promise<void>((resolve) => {
        const done = () => {
          signal?.removeEventListener("abort", done);
          this.wake = null;
          resolve();
        };
        this.wake = done;
        signal?.addEventListener("abort", done, { once: true });
      });
    }
    return signal?.aborted ? null : this.queue.shift()!;
  }
}

/**
 * The one stream of a client, while it has subscriptions: opened from the cursor of the
 * first, reopened from the last seq it read, and given up after MAX_FAILURES attempts in a
 * row that failed (the error then ends every subscription).
 */
class Hub {
  /** The last seq the stream read (a change, or an id past changes it may not show). */
  cursor: number;
  private readonly subs = new Set<Subscription>();
  private readonly stop = new AbortController();

  constructor(private readonly http: Http, cursor: number, private readonly onEnd: () => void) {
    this.cursor = cursor;
  }

  join(sub: Subscription): void {
    this.subs.add(sub);
    if (this.subs.size === 1) {
      this.run().catch((e: unknown) => this.end(e)); // run() settles every failure itself
    }
  }

  leave(sub: Subscription): void {
    this.subs.delete(sub);
    if (this.subs.size === 0) this.end(null);
  }

  /** No more stream: every subscription still here ends with `error` (null: none is left). */
  private end(error: unknown): void {
    this.onEnd();
    for (const sub of this.subs) sub.push({ error });
    this.subs.clear();
    this.stop.abort();
  }

  private async run(): Promise<void> {
    let backoff = 0; // the pause before the next reconnection
    let failures = 0;
    let failingSince = 0;
    while (!this.stop.signal.aborted) {
      const conn = new Connection(this.stop.signal);
      let worked = false; // delivered a change or an id, or kept the connection alive
      let why: unknown;
      try {
        const body = await this.http.stream(F.stream, {}, { query: { since: this.cursor }, signal: conn.signal });
        for await (const ev of conn.events(body)) {
          if (ev.data === null) {
            // An event with only an id: the server read up to there, past changes the session
            // rule or the grants left out; reopened from there, it does not read them again.
            const id = seqOf(ev.id);
            if (id !== undefined && id > this.cursor) this.cursor = id;
            worked = true;
            continue;
          }
          const data = parse(ev.data) as WireChange | { error?: unknown };
          if ("error" in data) throw fromBody(410, data, false, false); // the stream's own error event
          const c = data as WireChange;
          worked = true;
          if (c.seq <= this.cursor) continue; // never again what was read
          this.cursor = c.seq;
          for (const sub of this.subs) if (matches(c, sub.query)) sub.push({ change: c });
        }
        // The server ended the stream (it is stopping, or the store is busy): open it again.
        why = new StorageError(`GET ${this.http.base}${F.stream.path}: the stream ended before it delivered anything`);
      } catch (e) {
        if (this.stop.signal.aborted) return;
        if (!retried(e)) return this.end(e);
        why = e; // the network, a restart, a busy store, a gateway's 5xx: try again, from the cursor
      } finally {
        worked ||= conn.kept;
        conn.close();
      }
      if (worked) {
        failures = 0;
        backoff = 0; // the next cut is reopened at once
      } else if (++failures === 1) {
        failingSince = Date.now();
      } else if (failures >= MAX_FAILURES && Date.now() - failingSince >= this.http.timeout * 1000) {
        return this.end(why);
      }
      await pause(backoff / 2 + Math.random() * (backoff / 2), this.stop.signal);
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
  private readonly parser = new EventParser();

  constructor(private readonly outer: AbortSignal | undefined) {
    outer?.addEventListener("abort", this.onAbort, { once: true });
    this.alive();
  }

  get signal(): AbortSignal {
    return this.ctrl.signal;
  }

  /** A keep-alive came after the greeting: the stream stayed open and working for a while. */
  get kept(): boolean {
    return this.parser.comments >= 2;
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
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        this.alive();
        yield* this.parser.push(decoder.decode(value, { stream: true }));
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
  /** Comment lines read: the greeting, then a keep-alive every 15 s. */
  comments = 0;

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
      if (line.startsWith(":")) { // a comment: the greeting, a keep-alive
        this.comments++;
        continue;
      }
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
