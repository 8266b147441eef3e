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

import { CallFailed, CallInProgress, InDoubt, InvalidValue } from "./errors.js";
import type { Http } from "./http.js";
import { checkKey, checkSeconds, encode, fenceOf, type Fence, type JsonObject } from "./json.js";
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
 * `error` (the error's text) when given, else `result` (a JSON value; absent: null).
 */
export interface SettleOptions {
  result?: unknown;
  error?: string | null;
  /** A `Turn` or turn id: recorded only while it holds its lease, else LeaseLost. */
  fence?: Fence;
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

/** The text a failed call records, `"<Name>: <message>"`, as Turn.fail writes it. */
export function errorText(e: unknown): string {
  const text = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
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
    parts.push(`"call":${encode(opts.call)}`);
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
    body = `{"error":${encode(opts.error)}}`;
  } else {
    body = `{"result":${encode(opts.result === undefined ? null : opts.result)}}`;
  }
  await http.call<WireSettled>(R.settle, params, { json: body, fence });
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
  if (typeof fn !== "function") throw new InvalidValue("once takes a function to run");
  const { call, reconcile, fence, lease } = opts;
  let c = await claim(http, runId, callId, { call, fence, lease });
  for (;;) {
    if (c.status === "done") return c.result as T;
    if (c.status !== "in_doubt" || !reconcile) {
      if (c.status === "claimed") break;
      refuse(c, callId);
    }
    const found = await reconcile(callId, c.entry);
    if (found !== NOT_RUN) {
      await settle(http, runId, callId, { result: found, fence });
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
      try {
        await settle(http, runId, callId, { error: errorText(e), fence });
      } catch {
        // fn's own error is what propagates; the call stays in doubt for whoever resumes.
      }
    }
    throw e;
  }
  await settle(http, runId, callId, { result, fence });
  return result;
}
