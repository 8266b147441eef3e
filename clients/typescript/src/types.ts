/**
 * The objects the client returns: the server's answers with camelCase
 * fields and `Date`s for times (SPEC §13), and their converters.
 */

import type { JsonObject, JsonValue } from "./json.js";
import type { Versioned } from "./scope.js";
import type {
  WireChange, WireDiff, WireRevision, WireRun, WireRunHead, WireSession, WireSummary, WireTyped,
} from "./wire.js";

/** A time the server sent as ISO-8601 UTC with microseconds: a Date (to the millisecond). */
export function toDate(iso: string): Date {
  // Date.parse takes exactly three fraction digits everywhere; the server sends six.
  return new Date(iso.replace(/(\.\d{3})\d*/, "$1"));
}

/** One committed write in the feed (SPEC §9). */
export interface Change {
  seq: number;
  at: Date;
  topic: "kv" | "run" | "session";
  op: string;
  kind: string | null;
  scopeId: string | null;
  key: string | null;
  version: number | null;
  start: number | null;
  count: number | null;
}

export function toChange(c: WireChange): Change {
  return {
    seq: c.seq, at: toDate(c.at), topic: c.topic as Change["topic"], op: c.op, kind: c.kind,
    scopeId: c.scope_id, key: c.key, version: c.version, start: c.start, count: c.count,
  };
}

/**
 * One kept change of a key (SPEC §17): its `seq` and `op` in the feed, the key's `version`
 * after it, when (`at`), and the `value` it held after it (undefined after a delete or an
 * expiry; a `Uint8Array` for a value written as bytes).
 */
export interface Revision<T = JsonValue> {
  seq: number;
  version: number;
  op: string;
  at: Date;
  value: T | Uint8Array | undefined;
}

/** A key changed between two changes: what it was (`before`) and became (`after`). */
export interface Diff<T = JsonValue> {
  kind: string;
  scopeId: string;
  key: string;
  before: Versioned<T | Uint8Array>;
  after: Versioned<T | Uint8Array>;
}

/** The bytes of base64 text (the past's answers carry bytes so). */
function fromBase64(text: string): Uint8Array {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function typedValue(v: { value: JsonValue; type: string }): JsonValue | Uint8Array {
  return v.type === "bytes" ? fromBase64(v.value as string) : v.value;
}

export function toRevision<T>(r: WireRevision): Revision<T> {
  const gone = r.value === null && (r.op === "delete" || r.op === "expire");
  return { seq: r.seq, version: r.version, op: r.op, at: toDate(r.at),
    value: gone ? undefined : (typedValue(r) as T | Uint8Array) };
}

function toVersioned<T>(v: WireTyped): Versioned<T | Uint8Array> {
  return v.version === 0 ? { value: undefined, version: 0 }
    : { value: typedValue(v) as T | Uint8Array, version: v.version };
}

export function toDiff<T>(d: WireDiff): Diff<T> {
  return { kind: d.kind, scopeId: d.scope_id, key: d.key, before: toVersioned<T>(d.before),
    after: toVersioned<T>(d.after) };
}

/** A run's history and snapshot: `entries` in seq order, from the first one kept. */
export interface RunRecord {
  entries: JsonObject[];
  snapshot: JsonObject | null;
}

/** `runs.read()`: the record, with the run's id and the bounds of its history. */
export interface Run extends RunRecord {
  id: string;
  firstSeq: number;
  nextSeq: number;
  format: number;
}

export function toRun(d: WireRun): Run {
  return { id: d.id, entries: d.entries as JsonObject[], snapshot: d.snapshot, firstSeq: d.first_seq,
    nextSeq: d.next_seq, format: d.format };
}

/** `runs.head()`: a run's snapshot and bounds, without its history. */
export interface RunHead {
  id: string;
  snapshot: JsonObject | null;
  firstSeq: number;
  nextSeq: number;
  format: number;
  createdAt: Date;
  updatedAt: Date;
  /** Kept from `prune` (`runs.pin`). */
  pinned: boolean;
}

export function toRunHead(d: WireRunHead): RunHead {
  return { id: d.id, snapshot: d.snapshot, firstSeq: d.first_seq, nextSeq: d.next_seq, format: d.format,
    createdAt: toDate(d.created_at), updatedAt: toDate(d.updated_at), pinned: d.pinned };
}

/** `runs.list()`: one run, from its snapshot's `task`, `turn`, `stopped_by`, `finished`. */
export interface SavedState {
  id: string;
  task: string;
  createdAt: Date;
  updatedAt: Date;
  turn: number;
  stoppedBy: string | null;
  finished: boolean;
  /** Kept from `prune` (`runs.pin`). */
  pinned: boolean;
}

export function toSavedState(d: WireSummary): SavedState {
  return { id: d.id, task: d.task, createdAt: toDate(d.created_at), updatedAt: toDate(d.updated_at),
    turn: d.turn, stoppedBy: d.stopped_by, finished: d.finished, pinned: d.pinned };
}

/** Where a tool call stands after `runs.claim` (SPEC §14). */
export type ClaimStatus = "claimed" | "done" | "failed" | "in_progress" | "in_doubt";

/**
 * What `runs.claim` found or did: `result` (done) or `error` (failed) as recorded, else
 * undefined and null; `entry`, the call's newest entry (the claim, or its result).
 */
export interface Claim {
  status: ClaimStatus;
  result: JsonValue | undefined;
  error: string | null;
  entry: JsonObject;
}

/** A session: `owner` is the name of the principal that created it. */
export interface SessionInfo {
  id: string;
  owner: string;
  createdAt: Date;
  metadata: JsonObject;
}

export function toSession(d: WireSession): SessionInfo {
  return { id: d.id, owner: d.owner, createdAt: toDate(d.created_at), metadata: d.metadata };
}

/** A turn's states (SPEC §4); `expired`: a lapsed lease. */
export type TurnStatus = "queued" | "running" | "held" | "decided" | "resuming" | "finished" | "failed" | "expired";

export type { JsonObject, JsonValue };
