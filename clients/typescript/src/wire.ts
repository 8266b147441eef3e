/**
 * What goes over the wire: the answers' shapes as the server sends them
 * (snake_case), and the one table of the routes this client calls.
 *
 * Each shape is written twice on purpose, as a type (what the code reads)
 * and as a runtime description (what a test compares with the server's
 * GET /openapi.json). `shape<T>()` makes the compiler hold the two equal:
 * a field added to one and not the other does not build. The test
 * (test/openapi.ts, run by test/api.test.ts) then fails when the server adds or drops a route or
 * a field that this table does not know of.
 */

import type { JsonObject, JsonValue } from "./json.js";

// -- the answers -----------------------------------------------------------------------

export interface WireVersioned { key: string; value: JsonValue; version: number }
export interface WireVersion { version: number }
export interface WireDeleted { deleted: boolean }
export interface WireAppended { length: number; version: number }
export interface WireItems { items: JsonValue[] }
export interface WireTouched { touched: boolean; expires_at: string | null }
export interface WireExpiresAt { expires_at: string | null }
export interface WireLength { length: number }
export interface WireKeys { keys: string[]; next: string | null }
export interface WireValue { value: JsonValue; version: number }
export interface WireMany { values: Record<string, WireValue> }
export interface WireKeyValues { items: WireVersioned[]; next: string | null }
export interface WireCleared { cleared: number }
export interface WireBatchResults { results: JsonObject[] }
export interface WireSummary {
  id: string; task: string; turn: number; stopped_by: string | null; finished: boolean;
  created_at: string; updated_at: string; pinned: boolean;
}
export interface WireRuns { runs: WireSummary[]; next: string | null }
export interface WireRun {
  id: string; snapshot: JsonObject | null; entries: JsonValue[]; first_seq: number; next_seq: number;
  format: number;
}
export interface WireRunHead {
  id: string; snapshot: JsonObject | null; first_seq: number; next_seq: number; format: number;
  created_at: string; updated_at: string; pinned: boolean;
}
export interface WirePinned { pinned: boolean }
export interface WirePrunedRuns { runs: string[] }
export interface WirePrunedSessions { sessions: string[] }
export interface WireClaim {
  status: "claimed" | "done" | "failed" | "in_progress" | "in_doubt";
  /** Only when done. */
  result?: JsonValue;
  /** Only when failed. */
  error?: string;
  entry: JsonObject;
}
export interface WireSettled { entry: JsonObject }
export interface WireWritten { written: boolean }
export interface WireEntries { entries: JsonObject[] }
export interface WireRecord { entries: JsonObject[]; snapshot: JsonObject | null }
export interface WireId { id: string }
export interface WireRemoved { removed: number }
export interface WireSession { id: string; owner: string; created_at: string; metadata: JsonObject }
export interface WireSessions { sessions: WireSession[]; next: string | null }
export interface WireTurn {
  id: string; session_id: string; n: number; status: string; input: JsonValue; request: JsonValue;
  decision: JsonValue; result: JsonValue; error: string | null; lease: number | null;
  lease_until: number | null; created_at: string; updated_at: string;
}
export interface WireTurns { turns: WireTurn[]; next: string | null }
export interface WireChange {
  seq: number; at: string; topic: string; op: string; kind: string | null; scope_id: string | null;
  key: string | null; version: number | null; start: number | null; count: number | null;
}
export interface WireChanges { changes: WireChange[]; last: number }
export interface WireHead { head: number }
/** Every setting, with its default where none was set. */
export interface WireSettings { feed_retention?: number; history_retention?: number }
/** A value of the past's answers (SPEC §17): `type` "bytes" for a value written as bytes, its `value` base64. */
export interface WireTyped { value: JsonValue; version: number; type: string }
export interface WireRevision { seq: number; version: number; op: string; at: string; value: JsonValue; type: string }
export interface WireRevisions { revisions: WireRevision[]; next: number | null }
export interface WireDiff { kind: string; scope_id: string; key: string; before: WireTyped; after: WireTyped }
export interface WireDiffs { diffs: WireDiff[]; next: string | null }
export interface WireRestored { restored: number }
export interface WireProblems { problems: string[] }

// -- their runtime descriptions, held equal to the types by the compiler ---------------

/** A JSON type as the OpenAPI document names it; "any" is a schema without a type. */
type Tag<V> =
  [JsonValue] extends [V] ? "any" :
  [V] extends [string] ? "string" :
  [V] extends [string | null] ? "string|null" :
  [V] extends [boolean] ? "boolean" :
  [V] extends [number] ? "integer" | "number" :
  [V] extends [number | null] ? "integer|null" | "number|null" :
  [V] extends [readonly (infer E)[]] ? readonly [Tag<E>] :
  [V] extends [JsonObject] ? "object" :
  [V] extends [JsonObject | null] ? "object|null" :
  string extends keyof V ? { readonly "*": Tag<V[string & keyof V]> } : // a map: additionalProperties
  Shape<V>;

/** The tag of a field the server may leave out (not `required` in the document): "string?". */
type Optional<S> = S extends string ? `${S}?` : never;

/** Every field of `T`, no more, with its JSON type. */
export type Shape<T> = {
  readonly [K in keyof T]-?: {} extends Pick<T, K> ? Optional<Tag<Exclude<T[K], undefined>>> : Tag<T[K]>
};
/** A JSON type's tag, a list `[item]`, an object's fields, or a map `{"*": value}`. */
export type Described = string | readonly [Described] | { readonly [field: string]: Described };

const shape = <T>() => <const S extends Shape<T>>(s: S & Record<Exclude<keyof S, keyof T>, never>): S => s;

const SUMMARY = shape<WireSummary>()({
  id: "string", task: "string", turn: "integer", stopped_by: "string|null", finished: "boolean",
  created_at: "string", updated_at: "string", pinned: "boolean",
});
const VERSIONED = shape<WireVersioned>()({ key: "string", value: "any", version: "integer" });
const SESSION = shape<WireSession>()({ id: "string", owner: "string", created_at: "string", metadata: "object" });
const TURN = shape<WireTurn>()({
  id: "string", session_id: "string", n: "integer", status: "string", input: "any", request: "any",
  decision: "any", result: "any", error: "string|null", lease: "number|null",
  lease_until: "number|null", created_at: "string", updated_at: "string",
});
const TYPED = shape<WireTyped>()({ value: "any", version: "integer", type: "string" });
const CHANGE = shape<WireChange>()({
  seq: "integer", at: "string", topic: "string", op: "string", kind: "string|null",
  scope_id: "string|null", key: "string|null", version: "integer|null", start: "integer|null",
  count: "integer|null",
});

export const ANSWERS = {
  Versioned: VERSIONED,
  Version: shape<WireVersion>()({ version: "integer" }),
  Deleted: shape<WireDeleted>()({ deleted: "boolean" }),
  Appended: shape<WireAppended>()({ length: "integer", version: "integer" }),
  Items: shape<WireItems>()({ items: ["any"] }),
  Touched: shape<WireTouched>()({ touched: "boolean", expires_at: "string|null" }),
  ExpiresAt: shape<WireExpiresAt>()({ expires_at: "string|null" }),
  Length: shape<WireLength>()({ length: "integer" }),
  Keys: shape<WireKeys>()({ keys: ["string"], next: "string|null" }),
  Many: shape<WireMany>()({ values: { "*": { value: "any", version: "integer" } } }),
  KeyValues: shape<WireKeyValues>()({ items: [VERSIONED], next: "string|null" }),
  Cleared: shape<WireCleared>()({ cleared: "integer" }),
  BatchResults: shape<WireBatchResults>()({ results: ["object"] }),
  Runs: shape<WireRuns>()({ runs: [SUMMARY], next: "string|null" }),
  Run: shape<WireRun>()({
    id: "string", snapshot: "object|null", entries: ["any"], first_seq: "integer", next_seq: "integer",
    format: "integer",
  }),
  RunHead: shape<WireRunHead>()({
    id: "string", snapshot: "object|null", first_seq: "integer", next_seq: "integer", format: "integer",
    created_at: "string", updated_at: "string", pinned: "boolean",
  }),
  Pinned: shape<WirePinned>()({ pinned: "boolean" }),
  PrunedRuns: shape<WirePrunedRuns>()({ runs: ["string"] }),
  Settings: shape<WireSettings>()({ feed_retention: "integer?", history_retention: "integer?" }),
  Problems: shape<WireProblems>()({ problems: ["string"] }),
  PrunedSessions: shape<WirePrunedSessions>()({ sessions: ["string"] }),
  Claim: shape<WireClaim>()({ status: "string", result: "any?", error: "string?", entry: "object" }),
  Settled: shape<WireSettled>()({ entry: "object" }),
  Written: shape<WireWritten>()({ written: "boolean" }),
  Entries: shape<WireEntries>()({ entries: ["object"] }),
  Record: shape<WireRecord>()({ entries: ["object"], snapshot: "object|null" }),
  Id: shape<WireId>()({ id: "string" }),
  Removed: shape<WireRemoved>()({ removed: "integer" }),
  Session: SESSION,
  Sessions: shape<WireSessions>()({ sessions: [SESSION], next: "string|null" }),
  Turn: TURN,
  Turns: shape<WireTurns>()({ turns: [TURN], next: "string|null" }),
  Changes: shape<WireChanges>()({ changes: [CHANGE], last: "integer" }),
  Head: shape<WireHead>()({ head: "integer" }),
  Revisions: shape<WireRevisions>()({
    revisions: [shape<WireRevision>()({
      seq: "integer", version: "integer", op: "string", at: "string", value: "any", type: "string",
    })],
    next: "integer|null",
  }),
  Diffs: shape<WireDiffs>()({
    diffs: [shape<WireDiff>()({ kind: "string", scope_id: "string", key: "string", before: TYPED, after: TYPED })],
    next: "string|null",
  }),
  Restored: shape<WireRestored>()({ restored: "integer" }),
  Stream: "text/event-stream", // server-sent events of WireChange
  Change: CHANGE,
} as const;

/**
 * Why `answer` does not have the shape `d` describes, or null when it does: an object with
 * each field the server always sends, of its JSON type (one level deep: enough to tell an
 * agentstate answer from a proxy's `{}`, a page or another server's JSON).
 */
export function misfit(answer: unknown, d: Described): string | null {
  if (typeof d === "string") return d === "object" && !isObject(answer) ? "not an object" : null;
  if (Array.isArray(d)) return Array.isArray(answer) ? null : "not an array";
  if (!isObject(answer)) return "not an object";
  for (const [field, tag] of Object.entries(d as { readonly [field: string]: Described })) {
    const optional = typeof tag === "string" && tag.endsWith("?");
    if (!Object.hasOwn(answer, field)) {
      if (optional) continue;
      return `no field ${field}`;
    }
    if (!fits((answer as Record<string, unknown>)[field], optional ? (tag as string).slice(0, -1) : tag)) {
      return `${field} is not ${typeof tag === "string" ? tag.replace("|", " or ") : Array.isArray(tag) ? "an array" : "an object"}`;
    }
  }
  return null;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Whether a field's value has the JSON type of its tag (nested shapes: only that they are objects). */
function fits(v: unknown, tag: Described): boolean {
  if (Array.isArray(tag)) return Array.isArray(v);
  if (typeof tag !== "string") return isObject(v);
  return tag === "any" || tag.split("|").some((t) =>
    t === "null" ? v === null : t === "string" ? typeof v === "string" : t === "boolean" ? typeof v === "boolean"
      : t === "integer" || t === "number" ? typeof v === "number" || typeof v === "bigint" : t === "object" ? isObject(v)
        : false);
}

// -- the routes ------------------------------------------------------------------------

export type Method = "GET" | "PUT" | "POST" | "DELETE";

export interface Route {
  readonly method: Method;
  /** As in the OpenAPI document: `{name}` marks a path parameter. */
  readonly path: string;
  readonly answer: Described;
  /** Query parameters this client may send. */
  readonly query?: readonly string[];
  /** Body fields this client may send (a JSON object body). */
  readonly body?: readonly string[];
  /** A `not_found` here is a RunNotFound. */
  readonly run?: boolean;
  /** A write this client may fence with the X-Agentstate-Fence header (SPEC §14). */
  readonly fence?: boolean;
}

const r = (method: Method, path: string, answer: Described, more: Partial<Route> = {}): Route =>
  ({ method, path, answer, ...more });

/** The routes of one scope's keys, under `base` (a scope, or a session's own state). */
function keyRoutes(base: string) {
  const k = base + "/keys/{key}";
  const w = { fence: true };
  return {
    get: r("GET", k, ANSWERS.Versioned, { query: ["as_of"] }),
    put: r("PUT", k, ANSWERS.Version, { ...w, query: ["if_version", "ttl"], body: ["value", "if_version", "ttl", "keep_ttl"] }),
    delete: r("DELETE", k, ANSWERS.Deleted, { ...w, query: ["if_version"] }),
    append: r("POST", k + "/append", ANSWERS.Appended, { ...w, body: ["items", "ttl"] }),
    pop: r("POST", k + "/pop", ANSWERS.Items, { ...w, body: ["n"] }),
    touch: r("POST", k + "/touch", ANSWERS.Touched, { ...w, body: ["ttl"] }),
    expiresAt: r("GET", k + "/expires_at", ANSWERS.ExpiresAt, { query: ["as_of"] }),
    slice: r("GET", k + "/slice", ANSWERS.Items, { query: ["start", "stop", "as_of"] }),
    length: r("GET", k + "/length", ANSWERS.Length, { query: ["as_of"] }),
    history: r("GET", k + "/history", ANSWERS.Revisions, { query: ["since", "before", "limit"] }),
    keys: r("GET", base + "/keys", ANSWERS.Keys, { query: ["prefix", "after", "limit", "as_of"] }),
    getMany: r("POST", base + "/get_many", ANSWERS.Many, { body: ["keys", "as_of"] }),
    items: r("GET", base + "/items", ANSWERS.KeyValues, { query: ["prefix", "after", "limit", "as_of"] }),
    clear: r("POST", base + "/clear", ANSWERS.Cleared, w),
    restore: r("POST", base + "/restore", ANSWERS.Restored, { ...w, body: ["at", "keys"] }),
  };
}

export type KeyRoutes = ReturnType<typeof keyRoutes>;

/** Every route this client calls; the client builds every URL from this table. */
export const ROUTES = {
  scope: keyRoutes("/v1/scopes/{kind}/{id}"),
  sessionState: keyRoutes("/v1/sessions/{session_id}/state"),
  batch: r("POST", "/v1/batch", ANSWERS.BatchResults, { fence: true, body: ["ops"] }),
  runs: {
    list: r("GET", "/v1/runs", ANSWERS.Runs, { query: ["after", "limit"] }),
    prune: r("POST", "/v1/runs/prune", ANSWERS.PrunedRuns, { body: ["older_than", "finished_only"] }),
    read: r("GET", "/v1/runs/{run_id}", ANSWERS.Run, { run: true }),
    head: r("GET", "/v1/runs/{run_id}/head", ANSWERS.RunHead, { run: true }),
    delete: r("DELETE", "/v1/runs/{run_id}", ANSWERS.Deleted, { run: true }),
    write: r("POST", "/v1/runs/{run_id}/write", ANSWERS.Written, { run: true, fence: true, body: ["entries", "snapshot", "create"] }),
    entries: r("GET", "/v1/runs/{run_id}/entries", ANSWERS.Entries, { run: true, query: ["since", "limit"] }),
    tail: r("GET", "/v1/runs/{run_id}/tail", ANSWERS.Entries, { run: true, query: ["n"] }),
    load: r("GET", "/v1/runs/{run_id}/load", ANSWERS.Record, { run: true }),
    fork: r("POST", "/v1/runs/{run_id}/fork", ANSWERS.Id, { run: true, body: ["new_id", "upto"] }),
    trim: r("POST", "/v1/runs/{run_id}/trim", ANSWERS.Removed, { run: true, body: ["before"] }),
    pin: r("POST", "/v1/runs/{run_id}/pin", ANSWERS.Pinned, { run: true, body: ["pinned"] }),
    claim: r("POST", "/v1/runs/{run_id}/calls/{call_id}/claim", ANSWERS.Claim,
      { run: true, fence: true, body: ["call", "lease", "retry"] }),
    settle: r("POST", "/v1/runs/{run_id}/calls/{call_id}/settle", ANSWERS.Settled,
      { run: true, fence: true, body: ["result", "error"] }),
  },
  sessions: {
    create: r("POST", "/v1/sessions", ANSWERS.Session, { body: ["metadata"] }),
    list: r("GET", "/v1/sessions", ANSWERS.Sessions, { query: ["after", "limit"] }),
    prune: r("POST", "/v1/sessions/prune", ANSWERS.PrunedSessions, { body: ["idle_for"] }),
    get: r("GET", "/v1/sessions/{session_id}", ANSWERS.Session),
    delete: r("DELETE", "/v1/sessions/{session_id}", ANSWERS.Deleted),
    turns: r("GET", "/v1/sessions/{session_id}/turns", ANSWERS.Turns, { query: ["after", "limit"] }),
    startTurn: r("POST", "/v1/sessions/{session_id}/turns", ANSWERS.Turn, { body: ["input", "lease", "queued"] }),
    release: r("POST", "/v1/sessions/{session_id}/release", ANSWERS.Turn),
    fork: r("POST", "/v1/sessions/{session_id}/fork", ANSWERS.Session, { body: ["at", "metadata"] }),
    turnsByStatus: r("GET", "/v1/turns", ANSWERS.Turns, { query: ["status", "after", "limit"] }),
    getTurn: r("GET", "/v1/turns/{turn_id}", ANSWERS.Turn),
    act: r("POST", "/v1/turns/{turn_id}/{action}", ANSWERS.Turn, { body: ["lease", "request", "decision", "result", "error"] }),
  },
  admin: {
    settings: r("GET", "/v1/settings", ANSWERS.Settings),
    setSetting: r("PUT", "/v1/settings/{name}", ANSWERS.Settings, { body: ["value"] }),
    check: r("GET", "/v1/admin/check", ANSWERS.Problems),
    info: r("GET", "/v1/admin/info", "object"),
  },
  past: {
    diff: r("GET", "/v1/diff", ANSWERS.Diffs, { query: ["since", "until", "kind", "scope_id", "key", "limit", "after"] }),
  },
  feed: {
    changes: r("GET", "/v1/changes", ANSWERS.Changes, { query: ["since", "wait", "topic", "kind", "scope_id", "key", "limit"] }),
    head: r("GET", "/v1/changes/head", ANSWERS.Head),
    stream: r("GET", "/v1/changes/stream", ANSWERS.Stream, { query: ["since", "topic", "kind", "scope_id", "key", "limit"] }),
  },
} as const;

/** Routes of the server this client leaves alone on purpose, and why. */
export const NOT_CALLED: Readonly<Record<string, string>> = {
  "GET /v1/health": "for load balancers and probes: not in SPEC §13",
  "GET /v1/whoami": "the Python client's way to learn its token's principal; here connect() is told it (principal)",
  "GET /openapi.json": "the document itself (the tests read it)",
};
