/**
 * Tool calls that run at most once (SPEC §14): `runs.claim`, `runs.settle` and
 * `runs.once`, built on them exactly as Python's `once` is (agentstate/_calls.py).
 *
 * The server is the arbiter: a claim is a `tool_call` entry committed at the run's
 * next seq before the tool runs, its outcome a `tool_result` entry. Whatever dies
 * when, a later `once` finds the result, a live claim (CallInProgress) or a claim
 * in doubt (InDoubt, until `reconcile` says what happened): it never runs the tool
 * a second time unless `reconcile` answers NOT_RUN.
 */

import { CallFailed, CallInProgress, InDoubt, InvalidValue, TooLarge, UsageError } from "./errors.js";
import type { Http } from "./http.js";
import {
  MAX_RECORD, checkInt, checkKey, checkSeconds, encodeSized, fenceOf, type Fence, type JsonObject,
} from "./json.js";
import { toDate, type Claim } from "./types.js";
import { ROUTES, type WireClaim, type WireSettled } from "./wire.js";

/**
 * What a `reconcile` function of `runs.once` returns when the call's effect
 * did not happen, so the call may run again (SPEC §14).
 */
export const NOT_RUN: unique symbol = Symbol.for("agentstate.NOT_RUN");
export type NotRun = typeof NOT_RUN;

export interface ClaimOptions {
  /** What the call is (its name, its arguments): merged into the `tool_call` entry. */
  call?: JsonObject;
  /** A `Turn` or turn id: the claim is appended only while it holds its lease, else LeaseLost. */
  fence?: Fence;
  /** Seconds an unfenced claim stays live (default 300): past that it is in doubt. */
  lease?: number;
  /** Claim a call in doubt again (a new `tool_call` entry with `"retry": n`). */
  retry?: boolean;
}

/**
 * What `settle` records, as Python's `settle(..., result=None, error=None, fence=None)`:
 * `error` (the error's text) when given, else `result` (a JSON value; absent: null); not both.
 */
export interface SettleOptions {
  result?: unknown;
  error?: string | null;
  /** A `Turn` or turn id: recorded only while it holds its lease, else LeaseLost. */
  fence?: Fence;
  /**
   * The claim this settles: its entry's `retry` (0 for the first claim). A claim that a
   * later one superseded is then refused (InvalidTransition), recording nothing.
   */
  retry?: number;
}

export interface OnceOptions<T> {
  call?: JsonObject;
  /**
   * Asked when the call is in doubt (claimed, no result, its claim no longer live): the
   * call's result if its effect happened (recorded and returned), or NOT_RUN (it runs again).
   */
  reconcile?: (callId: string, entry: JsonObject) => T | NotRun | Promise<T | NotRun>;
  fence?: Fence;
  lease?: number;
}

const R = ROUTES.runs;

function ids(runId: string, callId: string): Record<string, string> {
  return { run_id: checkKey(runId, "run id"), call_id: checkKey(callId, "call id") };
}

/** The most a recorded result or error may take: a run entry's limit, less room for the entry's own fields. */
const MAX_OUTCOME = MAX_RECORD - 1024;

/** The text a failed call records, `"<Name>: <message>"`, as Turn.fail writes it. */
export function errorText(e: unknown): string {
  const text = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  return storable(text);
}

/** Any text, as JSON can keep it: NUL or a lone surrogate becomes U+FFFD. */
function storable(text: string): string {
  // Any text is recorded: what JSON cannot keep (NUL, a lone surrogate) becomes U+FFFD.
  return text.replace(/\0|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, "\uFFFD");
}

export async function claim(http: Http, runId: string, callId: string, opts: ClaimOptions = {}): Promise<Claim> {
  const params = ids(runId, callId);
  const fence = fenceOf(opts.fence);
  const parts: string[] = [];
  if (opts.call !== undefined && opts.call !== null) {
    if (typeof opts.call !== "object" || Array.isArray(opts.call)) {
      throw new InvalidValue("call must be an object of what the call is (its name, its arguments)");
    }
    parts.push(`"call":${encodeSized(opts.call, MAX_OUTCOME, "call")}`);
  }
  if (opts.lease !== undefined) parts.push(`"lease":${checkSeconds("lease", opts.lease)}`);
  if (opts.retry !== undefined && typeof opts.retry !== "boolean") throw new InvalidValue("retry must be true or false");
  if (opts.retry) parts.push(`"retry":true`);
  const d = await http.call<WireClaim>(R.claim, params, { json: `{${parts.join(",")}}`, fence });
  return {
    status: d.status,
    result: d.status === "done" ? d.result ?? null : undefined,
    error: d.status === "failed" ? d.error ?? "" : null,
    entry: d.entry,
  };
}

export async function settle(http: Http, runId: string, callId: string, opts: SettleOptions = {}): Promise<void> {
  const params = ids(runId, callId);
  const fence = fenceOf(opts.fence);
  let body: string;
  if (opts.error !== undefined && opts.error !== null) {
    if (typeof opts.error !== "string") throw new InvalidValue("error must be the error's text (a string)");
    if (opts.result !== undefined && opts.result !== null) {
      throw new InvalidValue("settle takes the call's result or its error, not both");
    }
    body = `{"error":${encodeSized(opts.error, MAX_OUTCOME, "error")}`;
  } else {
    body = `{"result":${encodeSized(opts.result === undefined ? null : opts.result, MAX_OUTCOME, "result")}`;
  }
  if (opts.retry !== undefined) body += `,"retry":${checkInt("retry", opts.retry)}`;
  await http.call<WireSettled>(R.settle, params, { json: body + "}", fence });
}

/** Which claim of a call a `tool_call` entry is: its `retry` (the first claim has none: 0). */
function claimCount(entry: JsonObject): number {
  return typeof entry.retry === "number" ? entry.retry : 0;
}

/** The error for a claim that may not run the call (done is not one). */
function refuse(c: Claim, callId: string): never {
  if (c.status === "failed") {
    throw new CallFailed(`call ${JSON.stringify(callId)} ran and failed: ${c.error}`, callId, c.error ?? "");
  }
  if (c.status === "in_progress") {
    throw new CallInProgress(`call ${JSON.stringify(callId)} is claimed by a worker whose claim is still live`,
      callId);
  }
  const at = typeof c.entry.at === "string" ? c.entry.at : null;
  throw new InDoubt(`call ${JSON.stringify(callId)} was claimed${at ? ` at ${at}` : ""} and has no result: ` +
    "it may or may not have run; pass reconcile to settle it", callId, at === null ? null : toDate(at));
}

export async function once<T>(http: Http, runId: string, callId: string, fn: () => T | Promise<T>,
  opts: OnceOptions<T> = {}): Promise<T> {
  const { call, reconcile, fence, lease } = opts;
  // Before anything is claimed: a claim whose fn cannot be called would be recorded as failed.
  for (const [name, f] of [["fn", fn], ["reconcile", reconcile]] as const) {
    if (typeof f !== "function" && !(name === "reconcile" && (f === undefined || f === null))) {
      throw new UsageError(`once() needs ${name} to be a function to call, got ${f === null ? "null" : typeof f} ` +
        "(pass the function, not its result)");
    }
  }
  let c = await claim(http, runId, callId, { call, fence, lease });
  for (;;) {
    if (c.status === "done") return c.result as T;
    if (c.status !== "in_doubt" || !reconcile) {
      if (c.status === "claimed") break;
      refuse(c, callId);
    }
    const found = await reconcile(callId, c.entry);
    if (found !== NOT_RUN) {
      await record(http, runId, callId, found, fence, c);
      return found as T;
    }
    c = await claim(http, runId, callId, { call, fence, lease, retry: true });
  }
  let result: T;
  try {
    result = await fn();
  } catch (e) {
    // A cancel (an AbortError: the caller's signal, not the tool's failure) records
    // nothing, as an interrupt in Python: the tool may have had its effect, so the call
    // stays in doubt for whoever resumes.
    if (!(typeof e === "object" && e !== null && (e as { name?: unknown }).name === "AbortError")) {
      await failed(http, runId, callId, errorText(e), fence, c);
    }
    throw e;
  }
  await record(http, runId, callId, result, fence, c);
  return result;
}

/**
 * Record what the call returned as the outcome of its claim `c`. A result that cannot be
 * recorded (not a JSON value, too large: refused here or by the server) settles the call as
 * failed instead, with `ResultNotRecorded: <why>` (SPEC §16: nothing runs again), and that
 * error is thrown.
 */
async function record(http: Http, runId: string, callId: string, result: unknown, fence: Fence | undefined,
  c: Claim): Promise<void> {
  try {
    await settle(http, runId, callId, { result: result === undefined ? null : result, fence, retry: claimCount(c.entry) });
  } catch (e) {
    if (e instanceof InvalidValue || e instanceof TooLarge) {
      await failed(http, runId, callId, storable(`ResultNotRecorded: ${e.message}`), fence, c);
    }
    throw e;
  }
}

/** Record `error` as the outcome of the claim `c`; if that fails too, the call stays in doubt for whoever resumes. */
async function failed(http: Http, runId: string, callId: string, error: string, fence: Fence | undefined,
  c: Claim): Promise<void> {
  try {
    await settle(http, runId, callId, { error, fence, retry: claimCount(c.entry) });
  } catch {
    // The caller's own error is what propagates.
  }
}
