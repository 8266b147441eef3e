/**
 * `db.runs` (SPEC §3): an append-only history of entries and one snapshot per run.
 */

import * as calls from "./calls.js";
import { InvalidValue, StorageError } from "./errors.js";
import type { Http } from "./http.js";
import { MAX_RECORD, checkAge, checkInt, checkKey, encodeSized, fenceOf, rawItems, type Fence } from "./json.js";
import {
  toRun, toRunHead, toSavedState, type Claim, type JsonObject, type Run, type RunHead, type RunRecord,
  type SavedState,
} from "./types.js";
import {
  ROUTES, type WireDeleted, type WireEntries, type WireId, type WirePinned, type WirePrunedRuns, type WireRecord, type WireRemoved,
  type WireRun, type WireRunHead, type WireRuns, type WireWritten,
} from "./wire.js";

const R = ROUTES.runs;

function id(runId: string, what = "run id"): Record<string, string> {
  return { run_id: checkKey(runId, what) };
}

function limitOf(limit: number | undefined): number | undefined {
  return limit === undefined ? undefined : checkInt("limit", limit);
}

export class Runs {
  /** @internal */
  constructor(private readonly http: Http) {}

  /**
   * Add `entries` (objects with an integer `seq`, continuing right after the last
   * stored seq) and replace the snapshot (null keeps it), in one transaction.
   * `create`: a new run (RunExists if the id is taken); else RunNotFound on a missing id.
   * `fence`: a Turn or turn id that must hold its lease (SPEC §14).
   * :throws HistoryGap, RunExists, RunNotFound, InvalidValue, LeaseLost
   */
  async write(runId: string, entries: JsonObject[], snapshot: JsonObject | null,
    opts: { create?: boolean; fence?: Fence } = {}): Promise<void> {
    const params = id(runId);
    const fence = fenceOf(opts.fence);
    if (!Array.isArray(entries)) throw new InvalidValue("entries must be an array");
    // Each entry and the snapshot within a run entry's limit (SPEC §3), as Python checks them.
    const texts = entries.map((e) => encodeSized(e, MAX_RECORD, "entry"));
    const body = `{"entries":[${texts.join(",")}],"snapshot":${encodeSized(snapshot ?? null, MAX_RECORD, "snapshot")},` +
      `"create":${opts.create === true}}`;
    await this.http.call<WireWritten>(R.write, params, { json: body, fence });
  }

  /** Every entry kept and the snapshot, with the history's bounds; null when absent. */
  async read(runId: string): Promise<Run | null> {
    const d = await this.http.maybe<WireRun>(R.read, id(runId));
    return d === null ? null : toRun(d);
  }

  /** The snapshot and the history's bounds, without the history; null when absent. */
  async head(runId: string): Promise<RunHead | null> {
    const d = await this.http.maybe<WireRunHead>(R.head, id(runId));
    return d === null ? null : toRunHead(d);
  }

  /**
   * Entries with seq >= `since`, at most `limit`; [] for an unknown run. `raw: true`: each
   * entry as its stored JSON text, cut out of the server's answer, never decoded.
   */
  entries(runId: string, opts: { since?: number; limit?: number; raw: true }): Promise<string[]>;
  entries(runId: string, opts?: { since?: number; limit?: number; raw?: false }): Promise<JsonObject[]>;
  async entries(runId: string, opts: { since?: number; limit?: number; raw?: boolean } = {}):
    Promise<JsonObject[] | string[]> {
    const params = id(runId);
    const q = { since: checkInt("since", opts.since ?? 0), limit: limitOf(opts.limit) };
    if (opts.raw !== undefined && typeof opts.raw !== "boolean") throw new InvalidValue("raw must be true or false");
    if (!opts.raw) return (await this.http.call<WireEntries>(R.entries, params, { query: q })).entries;
    const text = await this.http.text(R.entries, params, { query: q });
    try {
      return rawItems(text, "entries");
    } catch (e) {
      throw new StorageError(`the server's answer is not JSON (${(e as Error).message})`);
    }
  }

  /** The last `n` entries. */
  async tail(runId: string, n: number): Promise<JsonObject[]> {
    return (await this.http.call<WireEntries>(R.tail, id(runId), { query: { n: checkInt("n", n) } })).entries;
  }

  /**
   * The run ready to resume: every tool call without a result gets a synthetic
   * `{"type": "tool_result", "status": "unknown"}` entry (not saved). :throws RunNotFound, Damaged
   */
  async load(runId: string): Promise<RunRecord> {
    const d = await this.http.call<WireRecord>(R.load, id(runId));
    return { entries: d.entries, snapshot: d.snapshot };
  }

  /** Every run, most recently updated first; `after` (a page's last id) and `limit` page. */
  async list(opts: { after?: string; limit?: number } = {}): Promise<SavedState[]> {
    const limit = limitOf(opts.limit);
    if (limit === 0) return [];
    const q = { after: opts.after ? checkKey(opts.after, "after") : undefined, limit };
    return (await this.http.call<WireRuns>(R.list, {}, { query: q })).runs.map(toSavedState);
  }

  /**
   * Admins only: delete the runs not written for `olderThan` seconds (only those whose
   * snapshot says `finished`, unless `finishedOnly: false`; never a pinned one); their ids.
   * :throws Forbidden (not an admin), InvalidValue
   */
  async prune(opts: { olderThan: number; finishedOnly?: boolean }): Promise<string[]> {
    const olderThan = checkAge("olderThan", opts?.olderThan);
    const finishedOnly = opts.finishedOnly ?? true;
    if (typeof finishedOnly !== "boolean") throw new InvalidValue("finishedOnly must be true or false");
    const body = `{"older_than":${olderThan},"finished_only":${finishedOnly}}`;
    return (await this.http.call<WirePrunedRuns>(R.prune, {}, { json: body })).runs;
  }

  /** Remove the run; true if it existed. */
  async delete(runId: string): Promise<boolean> {
    return (await this.http.call<WireDeleted>(R.delete, id(runId))).deleted;
  }

  /** A new run `newId` with the entries up to and including seq `upto` (default: all) and the snapshot. */
  async fork(runId: string, newId: string, opts: { upto?: number } = {}): Promise<void> {
    const params = id(runId);
    const body = `{"new_id":${JSON.stringify(checkKey(newId, "new run id"))}` +
      `${opts.upto === undefined ? "" : `,"upto":${checkInt("upto", opts.upto)}`}}`;
    await this.http.call<WireId>(R.fork, params, { json: body });
  }

  /**
   * Keep the run from `prune` (`pinned` false: let it go again); whether it is pinned now.
   * An explicit `delete` or `trim` still acts on it. :throws RunNotFound
   */
  async pin(runId: string, pinned = true): Promise<boolean> {
    const params = id(runId);
    if (typeof pinned !== "boolean") throw new InvalidValue("pinned must be true or false");
    return (await this.http.call<WirePinned>(R.pin, params, { json: `{"pinned":${pinned}}` })).pinned;
  }

  /**
   * Claim the tool call `callId` of the run, or say where it stands, in one transaction:
   * `claimed` (a `tool_call` entry is committed: run the call, then `settle` it), `done`,
   * `failed`, `in_progress` (another claim is live) or `in_doubt` (a claim with no result
   * that is no longer live; `retry: true` claims it again). Every status is an answer.
   * :throws RunNotFound, LeaseLost (the fence lapsed: nothing appended), InvalidKey, InvalidValue
   */
  claim(runId: string, callId: string, opts: calls.ClaimOptions = {}): Promise<Claim> {
    return calls.claim(this.http, runId, callId, opts);
  }

  /**
   * Record a claimed call's outcome, as a `tool_result` entry: `error` (its text) when given,
   * else `result` (a JSON value; absent: null), as Python's `settle(result=, error=)`; not
   * both. `retry`: the claim it settles (its entry's `retry`, 0 for the first claim).
   * :throws InvalidTransition (not claimed, settled already, or claimed again since `retry`),
   * RunNotFound, LeaseLost, InvalidValue
   */
  settle(runId: string, callId: string, opts: calls.SettleOptions = {}): Promise<void> {
    return calls.settle(this.http, runId, callId, opts);
  }

  /**
   * Run `fn()` (sync or async) at most once for `(runId, callId)`, however often the process
   * dies and resumes and however many workers race, and return its result (a JSON value).
   * A recorded result is returned without calling anything; a recorded error throws
   * CallFailed. A claim whose worker may still run is CallInProgress; one no longer live is
   * in doubt: `reconcile(callId, entry)` returns the call's result or NOT_RUN (fn runs);
   * without it, InDoubt. If fn throws, `"<Name>: <message>"` is recorded and the error rethrown;
   * an AbortError (a cancel) records nothing and leaves the call in doubt. A result that cannot
   * be recorded (not JSON, too large) settles the call as failed, `"ResultNotRecorded: <why>"`,
   * and its error is thrown. :throws UsageError (fn or reconcile not a function: nothing
   * claimed), InDoubt, CallInProgress, CallFailed, LeaseLost, RunNotFound, InvalidValue, TooLarge,
   * InvalidTransition (a retry took the claim over while fn ran: its result is not recorded)
   */
  once<T>(runId: string, callId: string, fn: () => T | Promise<T>, opts: calls.OnceOptions<T> = {}): Promise<T> {
    return calls.once(this.http, runId, callId, fn, opts);
  }

  /** Remove the entries with seq < `before`; how many were removed. */
  async trim(runId: string, opts: { before: number }): Promise<number> {
    const params = id(runId);
    const body = `{"before":${checkInt("before", opts?.before)}}`;
    return (await this.http.call<WireRemoved>(R.trim, params, { json: body })).removed;
  }
}
