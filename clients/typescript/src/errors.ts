/**
 * The errors of agentstate (SPEC §6): one class per error, with the Python
 * names, a stable `code`, the matching HTTP `status`, and the server's fields
 * in camelCase. `err instanceof VersionConflict` works as `except` does.
 *
 * Each class's `name` is written out (the loop after the classes), never taken from the class:
 * a bundler that minifies (esbuild, Vite's default) renames classes, and
 * `err.name === "VersionConflict"` and the text a failed turn or call records
 * must not become a letter (SPEC §16).
 */

import { toDate } from "./types.js";

export class AgentStateError extends Error {
  /** A stable string, the same as the Python error's `.code`. */
  readonly code: string;
  /** The matching HTTP status. */
  readonly status: number;

  constructor(message: string, code = "error", status = 500) {
    super(message);
    this.code = code;
    this.status = status;
  }
}

/** A key, scope kind, scope id or name breaks the key rules. */
export class InvalidKey extends AgentStateError {
  constructor(message: string) { super(message, "invalid_key", 400); }
}

/** A value is not storable JSON (NaN, NUL, a Map, too deep, an unsafe number, ...). */
export class InvalidValue extends AgentStateError {
  constructor(message: string) { super(message, "invalid_value", 400); }
}

/** A value or list is over its size limit; `size` and `limit` in bytes. */
export class TooLarge extends AgentStateError {
  readonly size: number;
  readonly limit: number;
  constructor(message: string, size = 0, limit = 0) {
    super(message, "too_large", 413);
    this.size = size;
    this.limit = limit;
  }
}

/** `ifVersion` did not match; `currentVersion` is what is stored (0: absent). */
export class VersionConflict extends AgentStateError {
  readonly currentVersion: number;
  constructor(message: string, currentVersion = 0) {
    super(message, "version_conflict", 409);
    this.currentVersion = currentVersion;
  }
}

/** A list operation on a value that is not a list. */
export class NotAList extends AgentStateError {
  constructor(message: string) { super(message, "not_a_list", 409); }
}

/** Run entries do not continue right after the last stored seq. */
export class HistoryGap extends AgentStateError {
  constructor(message: string) { super(message, "history_gap", 409); }
}

/** A run with that id exists already. */
export class RunExists extends AgentStateError {
  constructor(message: string) { super(message, "already_exists", 409); }
}

/** No such session or turn (or not one this principal may see). */
export class NotFound extends AgentStateError {
  constructor(message: string) { super(message, "not_found", 404); }
}

/** No run with that id. */
export class RunNotFound extends NotFound {}

/** Another turn of the session is queued or running; `turnId` names it. */
export class SessionBusy extends AgentStateError {
  readonly turnId: string;
  constructor(message: string, turnId = "") {
    super(message, "session_busy", 409);
    this.turnId = turnId;
  }
}

/** A turn state change outside the diagram of SPEC §4. */
export class InvalidTransition extends AgentStateError {
  constructor(message: string) { super(message, "invalid_transition", 409); }
}

/** The principal may not do this. */
export class Forbidden extends AgentStateError {
  constructor(message: string) { super(message, "forbidden", 403); }
}

/** The store stayed locked by other writers past its busy timeout. */
export class Busy extends AgentStateError {
  constructor(message: string) { super(message, "busy", 503); }
}

/** A stored record is inconsistent. */
export class Damaged extends AgentStateError {
  constructor(message: string) { super(message, "damaged", 500); }
}

/** The store was written by a newer agentstate. */
export class SchemaTooNew extends AgentStateError {
  constructor(message: string) { super(message, "schema_too_new", 500); }
}

/** The store was closed. */
export class Closed extends AgentStateError {
  constructor(message: string) { super(message, "closed", 500); }
}

/**
 * An I/O failure, or a request that failed on the network. `outcomeUnknown`
 * is true when a write may or may not have been applied (its request was
 * sent and no answer came back): read the value back before retrying.
 */
export class StorageError extends AgentStateError {
  outcomeUnknown: boolean;
  constructor(message: string, outcomeUnknown = false) {
    super(message, "storage_error", 500);
    this.outcomeUnknown = outcomeUnknown;
  }
}

/** The changes after `since` are no longer kept: resynchronise and go on from `lastChange()`. */
export class CursorExpired extends AgentStateError {
  constructor(message: string) { super(message, "cursor_expired", 410); }
}

/** No token, or a token the server does not know. */
export class Unauthorized extends AgentStateError {
  constructor(message: string) { super(message, "unauthorized", 401); }
}

/** A call that cannot work where it was made. */
export class UsageError extends AgentStateError {
  constructor(message: string) { super(message, "usage_error", 400); }
}

/** A fenced write whose turn no longer holds its lease (SPEC §14); `turnId` names it. */
export class LeaseLost extends AgentStateError {
  readonly turnId: string;
  constructor(message: string, turnId = "") {
    super(message, "lease_lost", 409);
    this.turnId = turnId;
  }
}

/** A tool call that was claimed and may have run, with no result recorded (SPEC §14). */
export class InDoubt extends AgentStateError {
  readonly callId: string;
  readonly at: Date | null;
  constructor(message: string, callId = "", at: Date | null = null) {
    super(message, "in_doubt", 409);
    this.callId = callId;
    this.at = at;
  }
}

/** A tool call claimed by a caller whose claim is still live (SPEC §14). */
export class CallInProgress extends AgentStateError {
  readonly callId: string;
  constructor(message: string, callId = "") {
    super(message, "call_in_progress", 409);
    this.callId = callId;
  }
}

/** A tool call whose recorded outcome is an error (SPEC §14); `error` is its text. */
export class CallFailed extends AgentStateError {
  readonly callId: string;
  readonly error: string;
  constructor(message: string, callId = "", error = "") {
    super(message, "call_failed", 409);
    this.callId = callId;
    this.error = error;
  }
}

// Each class's name on its prototype, from an object's keys (which a minifier keeps, where it
// renames the classes): set before any error is made, so the stack's first line shows it too.
for (const [name, cls] of Object.entries({
  AgentStateError, InvalidKey, InvalidValue, TooLarge, VersionConflict, NotAList, HistoryGap,
  RunExists, NotFound, RunNotFound, SessionBusy, InvalidTransition, Forbidden, Busy, Damaged,
  SchemaTooNew, Closed, StorageError, CursorExpired, Unauthorized, UsageError, LeaseLost, InDoubt,
  CallInProgress, CallFailed,
})) {
  Object.defineProperty(cls.prototype, "name", { value: name, writable: true, configurable: true });
}

type Fields = Record<string, unknown>;
const str = (v: unknown): string => (typeof v === "string" ? v : "");
const num = (v: unknown): number => (typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : 0);
const date = (v: unknown): Date | null => (typeof v === "string" ? toDate(v) : null);

/** How each server code becomes its class, with the body's fields (snake_case) in camelCase. */
const BY_CODE: Record<string, (message: string, f: Fields) => AgentStateError> = {
  invalid_key: (m) => new InvalidKey(m),
  invalid_value: (m) => new InvalidValue(m),
  too_large: (m, f) => new TooLarge(m, num(f.size), num(f.limit)),
  version_conflict: (m, f) => new VersionConflict(m, num(f.current_version)),
  not_a_list: (m) => new NotAList(m),
  history_gap: (m) => new HistoryGap(m),
  already_exists: (m) => new RunExists(m),
  not_found: (m) => new NotFound(m),
  session_busy: (m, f) => new SessionBusy(m, str(f.turn_id)),
  invalid_transition: (m) => new InvalidTransition(m),
  forbidden: (m) => new Forbidden(m),
  busy: (m) => new Busy(m),
  damaged: (m) => new Damaged(m),
  schema_too_new: (m) => new SchemaTooNew(m),
  closed: (m) => new Closed(m),
  storage_error: (m, f) => new StorageError(m, f.outcome_unknown === true),
  cursor_expired: (m) => new CursorExpired(m),
  unauthorized: (m) => new Unauthorized(m),
  usage_error: (m) => new UsageError(m),
  lease_lost: (m, f) => new LeaseLost(m, str(f.turn_id)),
  in_doubt: (m, f) => new InDoubt(m, str(f.call_id), date(f.at)),
  call_in_progress: (m, f) => new CallInProgress(m, str(f.call_id)),
  call_failed: (m, f) => new CallFailed(m, str(f.call_id), str(f.error)),
  // The server has no such route (a proxy's prefix not stripped, a server older than this
  // client): nothing was done, and it is never an absent key (SPEC §16).
  unknown_route: (m) => new StorageError(`the server has no such route (${m}): connect() to the URL agentstate ` +
    "serves, with a server as new as this client", false),
  method_not_allowed: (m) => new StorageError(`the server has no such route (${m}): a server as new as this ` +
    "client?", false),
};

/**
 * The error of an answer's body `{"error": {"code", "message", ...}}`.
 * `run`: the route names a run, so `not_found` is a RunNotFound. An answer that
 * is not one of the server's own errors (a proxy's page, a gateway's 502, another
 * server's JSON) is a StorageError, and a write's outcome is unknown: whatever
 * answered may have passed the write on before failing. `where`: the call, for the message.
 */
export function fromBody(status: number, body: unknown, run: boolean, write: boolean, where = ""): AgentStateError {
  const info = typeof body === "object" && body !== null ? (body as Fields).error : undefined;
  const f = (typeof info === "object" && info !== null ? info : {}) as Fields;
  const code = typeof f.code === "string" ? f.code : "";
  const message = typeof f.message === "string" ? f.message : "";
  if (!Object.hasOwn(BY_CODE, code) || typeof f.message !== "string") {
    return new StorageError(`${where ? where + ": " : ""}the server answered ${status}` +
      (message ? `: ${message}` : " without an agentstate error"), write);
  }
  if (code === "not_found" && run) return new RunNotFound(message);
  return BY_CODE[code]!(message, f);
}