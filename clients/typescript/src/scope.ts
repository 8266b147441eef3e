/**
 * Scoped key-value state (SPEC §2 and §13): `db.scope(kind, id)`,
 * `db.state({...})` and `db.batch()`.
 */

import { InvalidValue, NotFound, UsageError, VersionConflict } from "./errors.js";
import type { Http } from "./http.js";
import {
  MAX_VALUE, checkInt, checkKey, checkKind, checkSeconds, checkSize, encodeSized, fenceOf, type Fence, type JsonValue,
  type ScopeKind,
} from "./json.js";
import { toDate, toRevision, type Revision } from "./types.js";
import {
  ROUTES, type KeyRoutes, type WireAppended, type WireBatchResults, type WireCleared, type WireDeleted,
  type WireExpiresAt, type WireItems, type WireKeyValues, type WireKeys, type WireLength, type WireMany,
  type WireRestored, type WireRevisions, type WireTouched, type WireVersion, type WireVersioned,
} from "./wire.js";

/** A value with its version; an absent key is `{ value: undefined, version: 0 }`. */
export interface Versioned<T = JsonValue> {
  value: T | undefined;
  version: number;
}

/** What an append left: the list's length and the key's new version. */
export interface Appended {
  length: number;
  version: number;
}

/** The option of every write: land only while this turn holds its lease, else LeaseLost (SPEC §14). */
export interface FenceOption {
  /** A `Turn` or a turn id; on a fenced scope, this one instead of the scope's. */
  fence?: Fence;
}

export interface PutOptions extends FenceOption {
  /** Write only if the key is at this version (0: only if absent); else VersionConflict. */
  ifVersion?: number;
  /** Seconds until the key expires; `"keep"`: the expiry it had. Default: it does not expire. */
  ttl?: number | "keep";
}

/** `history(key, ...)`: only changes after `since`, before `before`; at most `limit`, the newest. */
export interface HistoryOptions {
  since?: number;
  before?: number;
  limit?: number;
}

/** Paging of `keys` and `items`: a literal `prefix`, the keys `after` one, at most `limit`. */
export interface KeyPage {
  prefix?: string;
  after?: string;
  limit?: number;
}

/** Most keys one `getMany` reads (the store's limit). */
const MAX_MANY = 1000;

/** One `update()` of a key at a time among this client's callers (see Scope.update). */
export class UpdateTurns {
  private readonly tails = new Map<string, Promise<void>>();

  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const before = this.tails.get(key);
    let done!: () => void;
    const mine = new Promise<void>((resolve) => { done = resolve; });
    const tail = before ? before.then(() => mine) : mine;
    this.tails.set(key, tail);
    if (before) await waitAtMost(before, 1000);
    try {
      return await fn();
    } finally {
      done();
      if (this.tails.get(key) === tail) this.tails.delete(key);
    }
  }
}

/** Wait for `p`, or `ms` at most (a caller kept waiting goes ahead: the compare-and-set decides). */
async function waitAtMost(p: Promise<void>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    await Promise.race([p, new Promise<void>((resolve) => { timer = setTimeout(resolve, ms); })]);
  } finally {
    clearTimeout(timer);
  }
}

function ttlOf(ttl: unknown): number | undefined {
  return ttl === undefined || ttl === null ? undefined : checkSeconds("ttl", ttl);
}

function versionOf(v: unknown): number | undefined {
  return v === undefined || v === null ? undefined : checkInt("ifVersion", v);
}

function itemsOf(items: unknown): string {
  if (!Array.isArray(items)) throw new InvalidValue("items must be an array");
  return encodeSized(items, MAX_VALUE, "list");
}

/**
 * The keys of one scope, e.g. `db.scope("session", "s-42")`. Every method returns a Promise.
 * A scope made with a fence (`db.scope(kind, id, { fence })`) fences every write. A scope of
 * the past (`db.asOf(seq).scope(kind, id)`) reads the keys as they were right after change
 * `asOf` (SPEC §17), and every write throws UsageError.
 */
export class Scope {
  readonly kind: ScopeKind;
  readonly id: string;
  /** The turn id every write of this scope is fenced by, if any. */
  readonly fence: string | undefined;
  /** The change this scope's reads are of (`db.asOf(seq)`); undefined: the present. */
  readonly asOf: number | undefined;
  private readonly routes: KeyRoutes;
  private readonly params: Record<string, string>;

  /** @internal */
  constructor(private readonly http: Http, private readonly turns: UpdateTurns, kind: string, id: string,
    sessionState = false, fence?: Fence, asOf?: number) {
    this.kind = checkKind(kind);
    this.id = checkKey(id, "scope id");
    this.fence = fenceOf(fence);
    this.asOf = asOf === undefined ? undefined : checkInt("asOf", asOf);
    this.routes = sessionState ? ROUTES.sessionState : ROUTES.scope;
    this.params = sessionState ? { session_id: this.id } : { kind: this.kind, id: this.id };
  }

  /** The query of a read: `as_of` for a scope of the past. */
  private get past(): { as_of?: number } {
    return { as_of: this.asOf };
  }

  /** UsageError on a scope of the past, before anything is sent: the past is read-only. */
  private present(what: string): void {
    if (this.asOf !== undefined) {
      throw new UsageError(`${what}: the store as of change ${this.asOf} is read-only (write to db.scope(...), ` +
        "or put the past back with scope.restore(at))");
    }
  }

  private at(key: string): Record<string, string> {
    return { ...this.params, key: checkKey(key) };
  }

  /** The fence of one write: its own, else the scope's. */
  private fenced(opts: FenceOption | undefined): string | undefined {
    return opts?.fence === undefined || opts.fence === null ? this.fence : fenceOf(opts.fence);
  }

  /** The value of `key`, or `dflt` when absent. */
  get<T = JsonValue>(key: string): Promise<T | undefined>;
  get<T = JsonValue>(key: string, dflt: T): Promise<T>;
  async get<T = JsonValue>(key: string, dflt?: T): Promise<T | undefined> {
    const d = await this.http.maybe<WireVersioned>(this.routes.get, this.at(key), { query: this.past });
    return d === null ? dflt : (d.value as T);
  }

  /** `{ value, version }`; `{ value: undefined, version: 0 }` when absent. */
  async getVersioned<T = JsonValue>(key: string): Promise<Versioned<T>> {
    const d = await this.http.maybe<WireVersioned>(this.routes.get, this.at(key), { query: this.past });
    return d === null ? { value: undefined, version: 0 } : { value: d.value as T, version: d.version };
  }

  /** Write `value`; the new version. :throws VersionConflict (ifVersion), InvalidValue, TooLarge */
  async put(key: string, value: unknown, opts: PutOptions = {}): Promise<number> {
    this.present("put");
    const params = this.at(key);
    const fence = this.fenced(opts);
    const body = putBody(encodeSized(value), versionOf(opts.ifVersion), opts.ttl);
    return (await this.http.call<WireVersion>(this.routes.put, params, { json: body, fence })).version;
  }

  /** Remove `key`; true if it existed (same `ifVersion` rule as put). */
  async delete(key: string, opts: { ifVersion?: number } & FenceOption = {}): Promise<boolean> {
    this.present("delete");
    const params = this.at(key);
    const fence = this.fenced(opts);
    const q = { if_version: versionOf(opts.ifVersion) };
    return (await this.http.call<WireDeleted>(this.routes.delete, params, { query: q, fence })).deleted;
  }

  /**
   * Replace the value by `fn(value)` and return the new value: a compare-and-set
   * loop that never loses a concurrent update from any client. `fn` (sync or
   * async) gets `default` only when the key is absent, may run more than once,
   * and must have no side effects; if it throws, nothing is written. The key's
   * expiry is kept. This client's own updates of one key take turns, so they do
   * not make each other run `fn` again. With a fence, each write is fenced (LeaseLost ends the loop).
   * Without a `default`, `fn` gets `undefined` for an absent key, and its type says so.
   */
  update<T = JsonValue>(key: string, fn: (value: T) => T | Promise<T>,
    opts: { default: T } & FenceOption): Promise<T>;
  update<T = JsonValue>(key: string, fn: (value: T | undefined) => T | Promise<T>,
    opts?: { default?: T } & FenceOption): Promise<T>;
  async update<T = JsonValue>(key: string, fn: (value: T | undefined) => T | Promise<T>,
    opts: { default?: T } & FenceOption = {}): Promise<T> {
    this.present("update");
    const params = this.at(key);
    const fence = this.fenced(opts);
    return this.turns.run(`${this.routes.get.path}\n${JSON.stringify(params)}`, async () => {
      for (;;) {
        const d = await this.http.maybe<WireVersioned>(this.routes.get, params);
        const next = await fn(d === null ? opts.default : (d.value as T));
        const body = putBody(encodeSized(next), d === null ? 0 : d.version, "keep");
        try {
          await this.http.call<WireVersion>(this.routes.put, params, { json: body, fence });
          return next;
        } catch (e) {
          if (!(e instanceof VersionConflict)) throw e;
        }
      }
    });
  }

  /** Add `items` at the end of the list (created if absent), atomically. */
  async append(key: string, items: unknown[], opts: { ttl?: number } & FenceOption = {}): Promise<Appended> {
    this.present("append");
    const params = this.at(key);
    const fence = this.fenced(opts);
    const ttl = ttlOf(opts.ttl);
    const body = `{"items":${itemsOf(items)}${ttl === undefined ? "" : `,"ttl":${ttl}`}}`;
    const d = await this.http.call<WireAppended>(this.routes.append, params, { json: body, fence });
    return { length: d.length, version: d.version };
  }

  /** Items of a list with Python's slice rules (negatives too); [] when absent. :throws NotAList */
  async slice<T = JsonValue>(key: string, start = 0, stop?: number): Promise<T[]> {
    const params = this.at(key);
    const q = { start: checkInt("start", start, Number.MIN_SAFE_INTEGER),
      stop: stop === undefined || stop === null ? undefined : checkInt("stop", stop, Number.MIN_SAFE_INTEGER),
      ...this.past };
    return (await this.http.call<WireItems>(this.routes.slice, params, { query: q })).items as T[];
  }

  /** Items in a list; 0 when absent. :throws NotAList */
  async length(key: string): Promise<number> {
    return (await this.http.call<WireLength>(this.routes.length, this.at(key), { query: this.past })).length;
  }

  /** Remove the last `n` items and return them in list order; [] when absent. :throws NotAList */
  async pop<T = JsonValue>(key: string, n = 1, opts: FenceOption = {}): Promise<T[]> {
    this.present("pop");
    const params = this.at(key);
    const fence = this.fenced(opts);
    const body = `{"n":${checkInt("n", n)}}`;
    return (await this.http.call<WireItems>(this.routes.pop, params, { json: body, fence })).items as T[];
  }

  /** Keys of this scope, ascending; `prefix` is literal, `after` pages, `limit` caps. */
  async keys(opts: KeyPage = {}): Promise<string[]> {
    const q = { ...pageQuery(opts), ...this.past };
    if (q.limit === 0) return [];
    return (await this.http.call<WireKeys>(this.routes.keys, this.params, { query: q })).keys;
  }

  /**
   * Several keys in one read: `{ key: { value, version } }` for each of `keys`, in the order
   * given (an absent one: `{ value: undefined, version: 0 }`, as getVersioned). At most 1,000.
   * :throws InvalidKey, InvalidValue
   */
  async getMany<T = JsonValue>(keys: readonly string[]): Promise<Record<string, Versioned<T>>> {
    if (!Array.isArray(keys)) throw new InvalidValue("getMany() takes an array of keys");
    const wanted = keys.map((k) => checkKey(k));
    if (wanted.length > MAX_MANY) {
      throw new InvalidValue(`getMany() reads at most ${MAX_MANY} keys a call, got ${wanted.length}`);
    }
    const unique = [...new Set(wanted)];
    const found = unique.length === 0 ? {} : (await this.http.call<WireMany>(this.routes.getMany, this.params,
      { json: `{"keys":${JSON.stringify(unique)}${this.asOf === undefined ? "" : `,"as_of":${this.asOf}`}}` })).values;
    // fromEntries makes own properties: a key "__proto__" is a key like any other.
    return Object.fromEntries(wanted.map((k) => {
      const v = Object.hasOwn(found, k) ? found[k]! : undefined;
      return [k, v === undefined || v.version === 0 ? { value: undefined, version: 0 }
        : { value: v.value as T, version: v.version }];
    }));
  }

  /**
   * The keys of this scope with their values, ascending, in one read: `[key, { value, version }]`
   * pairs, paged as `keys()` is (a literal `prefix`, `after` a key, at most `limit`).
   */
  async items<T = JsonValue>(opts: KeyPage = {}): Promise<[string, Versioned<T>][]> {
    const q = { ...pageQuery(opts), ...this.past };
    if (q.limit === 0) return [];
    const d = await this.http.call<WireKeyValues>(this.routes.items, this.params, { query: q });
    return d.items.map((i) => [i.key, { value: i.value as T, version: i.version }]);
  }

  /** Delete every key of this scope, in one transaction; how many there were. */
  async clear(opts: FenceOption = {}): Promise<number> {
    this.present("clear");
    const fence = this.fenced(opts);
    return (await this.http.call<WireCleared>(this.routes.clear, this.params, { json: "{}", fence })).cleared;
  }

  /** Set a new expiry `ttl` seconds from now (null: never), value and version unchanged; false if absent. */
  async touch(key: string, ttl: number | null, opts: FenceOption = {}): Promise<boolean> {
    this.present("touch");
    const params = this.at(key);
    const fence = this.fenced(opts);
    const body = `{"ttl":${ttlOf(ttl) ?? "null"}}`;
    return (await this.http.call<WireTouched>(this.routes.touch, params, { json: body, fence })).touched;
  }

  /** When the key expires; null if it does not, or is absent. */
  async expiresAt(key: string): Promise<Date | null> {
    const d = await this.http.call<WireExpiresAt>(this.routes.expiresAt, this.at(key), { query: this.past });
    return d.expires_at === null ? null : toDate(d.expires_at);
  }

  /** Store raw bytes under `key` (the same key space); the new version. */
  async putBytes(key: string, data: Uint8Array,
    opts: { ifVersion?: number; ttl?: number } & FenceOption = {}): Promise<number> {
    this.present("putBytes");
    const params = this.at(key);
    const fence = this.fenced(opts);
    if (!(data instanceof Uint8Array)) throw new InvalidValue("putBytes takes a Uint8Array");
    checkSize(data.length, MAX_VALUE);
    const q = { if_version: versionOf(opts.ifVersion), ttl: ttlOf(opts.ttl) };
    return (await this.http.call<WireVersion>(this.routes.put, params, { bytes: data, query: q, fence })).version;
  }

  /** The raw bytes of `key` (a JSON value: its UTF-8 JSON text); null when absent. */
  async getBytes(key: string): Promise<Uint8Array | null> {
    const params = this.at(key);
    try {
      return await this.http.bytes(this.routes.get, params, { query: this.past });
    } catch (e) {
      if (e instanceof NotFound) return null;
      throw e;
    }
  }

  /**
   * The key's kept revisions, newest first (SPEC §17): `{ seq, version, op, at, value }` for
   * each change of it still kept (`value`: what it held after that change; undefined after a
   * delete or an expiry; a Uint8Array for bytes). `since`: only changes after that seq;
   * `before`: only changes before it (the next page of older ones); `limit`: at most that many.
   */
  async history<T = JsonValue>(key: string, opts: HistoryOptions = {}): Promise<Revision<T>[]> {
    this.present("history");
    const params = this.at(key);
    const opt = (name: string, v: unknown): number | undefined =>
      v === undefined || v === null ? undefined : checkInt(name, v);
    const since = opt("since", opts.since);
    let before = opt("before", opts.before);
    const limit = opt("limit", opts.limit);
    const out: Revision<T>[] = [];
    while (limit === undefined || out.length < limit) {
      const q = { since, before, limit: limit === undefined ? undefined : limit - out.length };
      const d = await this.http.call<WireRevisions>(this.routes.history, params, { query: q });
      out.push(...d.revisions.map((r) => toRevision<T>(r)));
      if (d.next === null) break;
      before = d.next; // a page ends at the server's limit or byte budget: on from there
    }
    return out;
  }

  /**
   * Put the scope's keys (or only `keys`) back as they were right after change `at`, as new
   * versions in one transaction, recorded in the feed like any write; a key made since is
   * deleted, and a restored key does not expire. How many keys changed.
   * :throws CursorExpired (older than the history kept), InvalidValue (past the newest change), LeaseLost
   */
  async restore(at: number, opts: { keys?: readonly string[] } & FenceOption = {}): Promise<number> {
    this.present("restore");
    const fence = this.fenced(opts);
    let body = `{"at":${checkInt("at", at)}`;
    if (opts.keys !== undefined && opts.keys !== null) {
      if (!Array.isArray(opts.keys)) throw new InvalidValue("keys must be an array of keys");
      body += `,"keys":${JSON.stringify(opts.keys.map((k) => checkKey(k)))}`;
    }
    return (await this.http.call<WireRestored>(this.routes.restore, this.params, { json: body + "}", fence })).restored;
  }
}

function pageQuery(opts: KeyPage): { prefix?: string; after?: string; limit?: number } {
  return {
    prefix: opts.prefix || undefined,
    after: opts.after ? checkKey(opts.after, "after") : undefined,
    limit: opts.limit === undefined ? undefined : checkInt("limit", opts.limit),
  };
}

function putBody(text: string, ifVersion: number | undefined, ttl: unknown): string {
  let body = `{"value":${text}`;
  if (ifVersion !== undefined) body += `,"if_version":${ifVersion}`;
  if (ttl === "keep") body += `,"keep_ttl":true`;
  else if (ttl !== undefined && ttl !== null) body += `,"ttl":${checkSeconds("ttl", ttl)}`;
  return body + "}";
}

/** `db.state({ session, agent, ... })`: the scopes of one invocation; reading a member not given throws. */
export class State {
  private readonly ids: Partial<Record<ScopeKind, string>>;

  /** @internal */
  constructor(private readonly make: (kind: ScopeKind, id: string) => Scope,
    ids: Partial<Record<ScopeKind, string>>) {
    this.ids = {};
    for (const [kind, id] of Object.entries(ids)) {
      if (id === undefined || id === null || kind === "fence") continue;
      checkKey(id, `${checkKind(kind)} id`);
      this.ids[kind as ScopeKind] = id;
    }
  }

  private get_(kind: ScopeKind): Scope {
    const id = this.ids[kind];
    if (id === undefined) throw new TypeError(`no ${kind} id was given to db.state()`);
    return this.make(kind, id);
  }

  get thread(): Scope { return this.get_("thread"); }
  get session(): Scope { return this.get_("session"); }
  get agent(): Scope { return this.get_("agent"); }
  get user(): Scope { return this.get_("user"); }
  get app(): Scope { return this.get_("app"); }
}

/** One result of a batch: put → version, delete → existed, append → `{length, version}`,
 * check → the version checked. */
export type BatchResult = number | boolean | Appended;

/** `db.batch()`: writes collected here, applied all or none by `commit()` in one request. */
export class Batch {
  private readonly ops: string[] = [];
  private committed = false;
  /** The turn id that fences every write of the batch, if any. */
  readonly fence: string | undefined;

  /** @internal */
  constructor(private readonly http: Http, fence?: Fence) {
    this.fence = fenceOf(fence);
  }

  /** The writes of one scope; each is checked now (and throws now), sent at commit. */
  scope(kind: string, id: string): BatchScope {
    return new BatchScope(this, checkKind(kind), checkKey(id, "scope id"));
  }

  /** @internal */
  add(op: string): void {
    if (this.committed) throw new InvalidValue("this batch was committed already: make a new one");
    this.ops.push(op);
  }

  /** Apply every write, all or none; the results in order. :throws the first failing op's error */
  async commit(): Promise<BatchResult[]> {
    if (this.committed) throw new InvalidValue("this batch was committed already");
    this.committed = true;
    if (this.ops.length === 0) return [];
    const d = await this.http.call<WireBatchResults>(ROUTES.batch, {},
      { json: `{"ops":[${this.ops.join(",")}]}`, fence: this.fence });
    return d.results.map((r) => (typeof r.length === "number" ? { length: r.length, version: r.version as number }
      : typeof r.deleted === "boolean" ? r.deleted : (r.version as number)));
  }
}

export class BatchScope {
  private readonly head: string;

  /** @internal */
  constructor(private readonly batch: Batch, kind: ScopeKind, id: string) {
    this.head = `"scope":${JSON.stringify(`${kind}:${id}`)}`;
  }

  private op(op: string, key: string, rest: string): this {
    this.batch.add(`{"op":"${op}",${this.head},"key":${JSON.stringify(checkKey(key))}${rest}}`);
    return this;
  }

  put(key: string, value: unknown, opts: { ifVersion?: number; ttl?: number } = {}): this {
    const v = versionOf(opts.ifVersion);
    const ttl = ttlOf(opts.ttl);
    return this.op("put", key, `,"value":${encodeSized(value)}${v === undefined ? "" : `,"if_version":${v}`}` +
      `${ttl === undefined ? "" : `,"ttl":${ttl}`}`);
  }

  delete(key: string, opts: { ifVersion?: number } = {}): this {
    const v = versionOf(opts.ifVersion);
    return this.op("delete", key, v === undefined ? "" : `,"if_version":${v}`);
  }

  append(key: string, items: unknown[], opts: { ttl?: number } = {}): this {
    const ttl = ttlOf(opts.ttl);
    return this.op("append", key, `,"items":${itemsOf(items)}${ttl === undefined ? "" : `,"ttl":${ttl}`}`);
  }

  /** Writes nothing: the batch applies only if `key` is at `ifVersion` (0: absent), and the
   * key stays at it until the batch commits. Its result is that version. */
  check(key: string, opts: { ifVersion: number }): this {
    const v = versionOf(opts?.ifVersion);
    if (v === undefined) throw new InvalidValue("check needs ifVersion: the version the key must be at (0: absent)");
    return this.op("check", key, `,"if_version":${v}`);
  }
}
