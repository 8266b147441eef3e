/**
 * `connect(url, { token })`: the State API of an `agentstate serve`, with
 * the objects of the Python client (SPEC §13).
 */

import { InvalidValue, Unauthorized, UsageError } from "./errors.js";
import { Feed, type FeedFilter } from "./feed.js";
import { Http, type Fetch } from "./http.js";
import { checkInt, checkKey, checkKind, checkSeconds, fenceOf, type Fence, type JsonObject, type JsonValue,
  type ScopeKind } from "./json.js";
import { Past } from "./past.js";
import { Runs } from "./runs.js";
import { Batch, Scope, State, UpdateTurns } from "./scope.js";
import { Sessions } from "./sessions.js";
import { toDiff, type Change, type Diff } from "./types.js";
import { ROUTES, type WireDiffs, type WireProblems, type WireSettings } from "./wire.js";

export interface ConnectOptions {
  /** A bearer token (`agentstate tokens create NAME`). */
  token: string;
  /** An admin's token acting for this principal (the X-Agentstate-Principal header). */
  principal?: string;
  /** A fetch to use instead of the platform's (a proxy, a test double, an older runtime). */
  fetch?: Fetch;
  /**
   * Seconds one call may take, default 30 (as Python's `connect`): past that it is a
   * StorageError (a write's `outcomeUnknown` true). A long poll gets its wait on top; a
   * stream's connection, its headers.
   */
  timeout?: number;
}

/** `db.settings()`: each setting's value (seconds), by the server's name for it. */
export type Settings = WireSettings;

const MAX_SETTING = 100 * 365 * 86400;

/** `db.diff(since, ...)`: up to `until` (default: the newest change), filtered as the feed is. */
export interface DiffOptions {
  until?: number;
  kind?: ScopeKind;
  scopeId?: string;
  key?: string;
}

/** The ids of `db.state(...)`: one per scope kind used; `fence` fences every write of them. */
export type StateIds = Partial<Record<ScopeKind, string>> & { fence?: Fence };

export class Database {
  /** Runs: histories and snapshots (SPEC §3). */
  readonly runs: Runs;
  /** Sessions and their turns (SPEC §4). */
  readonly sessions: Sessions;
  /** The server's address. */
  readonly url: string;
  private readonly http: Http;
  private readonly turns = new UpdateTurns();
  private readonly feed: Feed;

  /** @internal */
  constructor(http: Http) {
    this.http = http;
    this.url = http.base;
    this.runs = new Runs(http);
    this.sessions = new Sessions(http, this.turns);
    this.feed = new Feed(http);
  }

  /**
   * The keys of one scope: kind `thread`, `session`, `agent`, `user` or `app`. `fence`
   * (a Turn or turn id): every write lands only while that turn holds its lease (SPEC §14).
   * :throws InvalidKey
   */
  scope(kind: ScopeKind, id: string, opts: { fence?: Fence } = {}): Scope {
    return new Scope(this.http, this.turns, kind, id, false, opts.fence);
  }

  /** Several scopes of one invocation; reading a member whose id was not given throws. */
  state(ids: StateIds): State {
    const fence = fenceOf(ids?.fence);
    return new State((kind, id) => this.scope(kind, id, { fence }), ids);
  }

  /** Writes collected and applied all or none, in one request, by `commit()`; `fence` fences them all. */
  batch(opts: { fence?: Fence } = {}): Batch {
    return new Batch(this.http, opts.fence);
  }

  /**
   * The store as it was right after change `seq` (SPEC §17), read-only: `db.asOf(seq).scope(kind,
   * id).get(key)` (and getVersioned, getMany, items, keys, slice, length, expiresAt, getBytes;
   * a write throws UsageError). A key that did not exist yet, was deleted or had expired by
   * then reads as absent. Each read checks `seq`: past the newest change InvalidValue, older
   * than the history kept CursorExpired. :throws InvalidValue (not a seq)
   */
  asOf(seq: number): Past {
    return new Past(this.http, this.turns, seq);
  }

  /**
   * Every key changed after change `since` up to `until` (default: the newest) that this
   * token may read, ordered by kind, scope id and key: `{ kind, scopeId, key, before, after }`,
   * each a Versioned (absent: `{ value: undefined, version: 0 }`; bytes: a Uint8Array). A key
   * changed and changed back is listed with equal values. (The server answers a page at a
   * time; this follows every page.)
   * :throws CursorExpired, InvalidValue (a seq past the newest change, `until` before `since`)
   */
  async diff<T = JsonValue>(since: number, opts: DiffOptions = {}): Promise<Diff<T>[]> {
    const q = {
      since: checkInt("since", since),
      until: opts.until === undefined || opts.until === null ? undefined : checkInt("until", opts.until),
      kind: opts.kind === undefined ? undefined : checkKind(opts.kind),
      scope_id: opts.scopeId === undefined ? undefined : checkKey(opts.scopeId, "scopeId"),
      key: opts.key === undefined ? undefined : checkKey(opts.key),
    };
    const out: Diff<T>[] = [];
    let after: string | undefined;
    for (;;) { // the server answers a page at a time: every page, in order
      const page = await this.http.call<WireDiffs>(ROUTES.past.diff, {}, { query: { ...q, after } });
      out.push(...page.diffs.map((d) => toDiff<T>(d)));
      if (page.next === null || page.next === undefined) return out;
      after = page.next;
    }
  }

  /** Every setting of the store, with its default where none was set (`feed_retention`: seconds). */
  async settings(): Promise<Settings> {
    return this.http.call<WireSettings>(ROUTES.admin.settings, {});
  }

  /**
   * Admins only: set a setting for every client of the store, a whole number of seconds
   * from 0 to 100 years. :throws InvalidValue (unknown name, bad value), Forbidden
   */
  async setSetting(name: string, value: number): Promise<void> {
    const params = { name: checkKey(name, "setting name") };
    if (!Number.isSafeInteger(value) || value < 0 || value > MAX_SETTING) {
      throw new InvalidValue(`${name} must be a whole number of seconds from 0 to 100 years, got ${String(value)}`);
    }
    await this.http.call<WireSettings>(ROUTES.admin.setSetting, params, { json: `{"value":${value}}` });
  }

  /** Admins only: the store's integrity check and invariants; each problem as text, [] when all hold. */
  async check(): Promise<string[]> {
    return (await this.http.call<WireProblems>(ROUTES.admin.check, {})).problems;
  }

  /** Admins only: the store's sizes, schema version, durability and row counts, as the server says them. */
  async info(): Promise<JsonObject> {
    return this.http.call<JsonObject>(ROUTES.admin.info, {});
  }

  /** The newest change's seq (0 on a new store). */
  lastChange(): Promise<number> {
    return this.feed.lastChange();
  }

  /** Changes after `since` (default 0), ascending, filtered. :throws CursorExpired */
  changes(opts: { since?: number } & FeedFilter = {}): Promise<Change[]> {
    return this.feed.changes(opts);
  }

  /** A long poll: the changes after `since`, waiting up to `timeout` seconds for one. */
  watch(since: number, opts: { timeout?: number; signal?: AbortSignal } & FeedFilter = {}): Promise<Change[]> {
    return this.feed.watch(since, opts);
  }

  /** Every change after `since` as it comes, reconnecting by itself; ends when `signal` aborts. */
  subscribe(since?: number, opts: { signal?: AbortSignal } & FeedFilter = {}): AsyncGenerator<Change, void, undefined> {
    return this.feed.subscribe(since, opts);
  }
}

/**
 * A client of the agentstate server at `url` (`http://host:8765`; in a page, a URL relative to
 * it such as `"/state"`).
 * :throws Unauthorized (no token, or one that cannot be sent in a header), InvalidValue (not an
 * http(s) base URL, or one with credentials; timeout), InvalidKey (principal), UsageError (a
 * relative URL where there is no page)
 */
export function connect(url: string, opts: ConnectOptions): Database {
  const base = baseUrl(url);
  if (!opts || typeof opts.token !== "string" || opts.token.trim() === "") {
    throw new Unauthorized("connect() needs a token: agentstate tokens create NAME");
  }
  const token = opts.token.trim();
  // The server's tokens are URL-safe base64; anything a header cannot carry (a line break, a
  // control character, a space, a non-ASCII letter) would fail in fetch, whose message shows
  // the header, or inject another header. Refused here, without repeating it.
  if (!/^[\x21-\x7e]+$/.test(token)) {
    throw new Unauthorized("connect() was given a token that cannot be sent in a header (it has a line break, " +
      "a space, a control character or a non-ASCII character): agentstate tokens create NAME makes one");
  }
  const principal = opts.principal === undefined ? undefined : checkKey(opts.principal, "principal");
  const timeout = opts.timeout === undefined ? 30 : checkSeconds("timeout", opts.timeout);
  return new Database(new Http(base, token, principal, opts.fetch, timeout));
}

/**
 * The server's base URL, http(s), without `user:password@` (it would be in every error message
 * and in `db.url`: the token is the credential), a query or a fragment (the routes follow the path).
 * An error never repeats a URL that may hold a password.
 */
function baseUrl(url: unknown): string {
  const want = "connect() takes the server's http:// or https:// URL";
  if (typeof url !== "string") throw new InvalidValue(`${want}, got ${url === null ? "null" : typeof url}`);
  let u: URL;
  if (/^[A-Za-z][A-Za-z0-9+.-]*:/.test(url)) {
    try {
      u = new URL(url);
    } catch {
      throw new InvalidValue(`${want}, got a string that is not a URL`);
    }
  } else {
    // A relative URL ("/state"): the page's own server, where there is a page (SPEC §16).
    const page = (globalThis as { location?: { href?: unknown } }).location?.href;
    if (typeof page !== "string") {
      throw new UsageError(`${want}: a relative URL needs a page to be relative to, and here there is none ` +
        "(no location): give the whole URL, http://host:8765");
    }
    try {
      u = new URL(url, page);
    } catch {
      throw new InvalidValue(`${want}, got a string that is not a URL`);
    }
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") throw new InvalidValue(`${want}, got a ${u.protocol} URL`);
  if (u.username !== "" || u.password !== "") {
    throw new InvalidValue(`${want} without credentials (user:password@): the token is given as { token }`);
  }
  if (u.search !== "" || u.hash !== "" || url.includes("?") || url.includes("#")) {
    throw new InvalidValue(`${want} without a ?query or #fragment, got ${u.origin}${u.pathname}...`);
  }
  return (u.origin + u.pathname).replace(/\/+$/, "");
}
