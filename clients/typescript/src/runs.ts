/**
 * `db.runs` (SPEC §3): an append-only history of entries and one snapshot per run.
 */

import { InvalidValue } from "./errors.js";
import type { Http } from "./http.js";
import { checkInt, checkKey, encode } from "./json.js";
import {
  toRun, toRunHead, toSavedState, type JsonObject, type Run, type RunHead, type RunRecord, type SavedState,
} from "./types.js";
import {
  ROUTES, type WireDeleted, type WireEntries, type WireId, type WireRecord, type WireRemoved, type WireRun,
  type WireRunHead, type WireRuns, type WireWritten,
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
   * :throws HistoryGap, RunExists, RunNotFound, InvalidValue
   */
  async write(runId: string, entries: JsonObject[], snapshot: JsonObject | null,
    opts: { create?: boolean } = {}): Promise<void> {
    const params = id(runId);
    if (!Array.isArray(entries)) throw new InvalidValue("entries must be an array");
    const body = `{"entries":${encode(entries)},"snapshot":${encode(snapshot ?? null)},` +
      `"create":${opts.create === true}}`;
    await this.http.call<WireWritten>(R.write, params, { json: body });
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

  /** Entries with seq >= `since`, at most `limit`. */
  async entries(runId: string, opts: { since?: number; limit?: number } = {}): Promise<JsonObject[]> {
    const q = { since: checkInt("since", opts.since ?? 0), limit: limitOf(opts.limit) };
    return (await this.http.call<WireEntries>(R.entries, id(runId), { query: q })).entries;
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

  /** Remove the entries with seq < `before`; how many were removed. */
  async trim(runId: string, opts: { before: number }): Promise<number> {
    const params = id(runId);
    const body = `{"before":${checkInt("before", opts?.before)}}`;
    return (await this.http.call<WireRemoved>(R.trim, params, { json: body })).removed;
  }
}
