/**
 * agentstate: the TypeScript client of the State API (SPEC §13).
 *
 * ```ts
 * import { connect } from "agentstate-db";
 * const db = connect("http://127.0.0.1:8765", { token });
 * await db.scope("agent", "bot").update<number>("visits", (n) => n + 1, { default: 0 });
 * ```
 */

export { connect, Database, type ConnectOptions, type DiffOptions, type Settings, type StateIds } from "./client.js";
export { Past } from "./past.js";
export {
  Batch, BatchScope, Scope, State, type Appended, type BatchResult, type FenceOption, type HistoryOptions, type KeyPage,
  type PutOptions, type Versioned,
} from "./scope.js";
export { Runs } from "./runs.js";
export { NOT_RUN, type ClaimOptions, type NotRun, type OnceOptions, type SettleOptions } from "./calls.js";
export { Sessions, Turn } from "./sessions.js";
export type { FeedFilter } from "./feed.js";
export type { Fetch } from "./http.js";
export type { Fence, JsonObject, JsonValue, ScopeKind } from "./json.js";
export type {
  Change, Claim, ClaimStatus, Diff, Revision, Run, RunHead, RunRecord, SavedState, SessionInfo, TurnStatus,
} from "./types.js";
export {
  AgentStateError, Busy, CallFailed, CallInProgress, Closed, CursorExpired, Damaged, Forbidden, HistoryGap,
  InDoubt, InvalidKey, InvalidTransition, InvalidValue, LeaseLost, NotAList, NotFound, RunExists, RunNotFound,
  SchemaTooNew, SessionBusy, StorageError, TooLarge, Unauthorized, UsageError, VersionConflict,
} from "./errors.js";
