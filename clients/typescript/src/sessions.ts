/**
 * `db.sessions` (SPEC §4): sessions owned by principals, and their turns.
 * The principal is the token's (or, for an admin, the one given to `connect`).
 */

import { errorText } from "./calls.js";
import { InvalidTransition, InvalidValue, TooLarge } from "./errors.js";
import type { Http } from "./http.js";
import { checkAge, checkInt, checkKey, checkSeconds, encode, encodeSized, type JsonValue } from "./json.js";
import { Scope, type UpdateTurns } from "./scope.js";
import { toDate, toSession, type JsonObject, type SessionInfo, type TurnStatus } from "./types.js";
import {
  ROUTES, type WireDeleted, type WirePrunedSessions, type WireSession, type WireSessions, type WireTurn, type WireTurns,
} from "./wire.js";

const S = ROUTES.sessions;

function sid(sessionId: string): Record<string, string> {
  return { session_id: checkKey(sessionId, "session id") };
}

function tid(turnId: string): Record<string, string> {
  return { turn_id: checkKey(turnId, "turn id") };
}

function page(opts: { after?: string; limit?: number }): { after?: string; limit?: number } {
  return { after: opts.after ? checkKey(opts.after, "after") : undefined,
    limit: opts.limit === undefined ? undefined : checkInt("limit", opts.limit) };
}

/** One turn of a session; its methods move it along the diagram of SPEC §4 and update it. */
export class Turn {
  id!: string;
  sessionId!: string;
  /** Its number in the session, from 1. */
  n!: number;
  status!: TurnStatus;
  input!: JsonValue;
  request!: JsonValue;
  decision!: JsonValue;
  result!: JsonValue;
  error!: string | null;
  /** Seconds of its lease. */
  lease!: number | null;
  leaseUntil!: Date | null;
  createdAt!: Date;
  updatedAt!: Date;

  /** @internal */
  constructor(private readonly http: Http, d: WireTurn) {
    this.load(d);
  }

  private load(d: WireTurn): this {
    this.id = d.id;
    this.sessionId = d.session_id;
    this.n = d.n;
    this.status = d.status as TurnStatus;
    this.input = d.input;
    this.request = d.request;
    this.decision = d.decision;
    this.result = d.result;
    this.error = d.error;
    this.lease = d.lease;
    this.leaseUntil = d.lease_until === null ? null : new Date(d.lease_until * 1000);
    this.createdAt = toDate(d.created_at);
    this.updatedAt = toDate(d.updated_at);
    return this;
  }

  private async act(action: string, body: string): Promise<this> {
    return this.load(await this.http.call<WireTurn>(S.act, { ...tid(this.id), action }, { json: body }));
  }

  /** Re-read the turn from the server. */
  async refresh(): Promise<this> {
    return this.load(await this.http.call<WireTurn>(S.getTurn, tid(this.id)));
  }

  /** queued → running, with a new lease of `lease` seconds (default 60). */
  start(lease?: number): Promise<this> {
    return this.act("start", `{"lease":${lease === undefined ? "null" : checkSeconds("lease", lease)}}`);
  }

  /** Renew the lease of a running (or resuming) turn; by its last length if not given. */
  heartbeat(lease?: number): Promise<this> {
    return this.act("heartbeat", `{"lease":${lease === undefined ? "null" : checkSeconds("lease", lease)}}`);
  }

  /** running → held: waits for a decision and no longer blocks the session. */
  hold(request: unknown = null): Promise<this> {
    return this.act("hold", `{"request":${encodeSized(request)}}`);
  }

  /** running or resuming → finished. */
  finish(result: unknown = null): Promise<this> {
    return this.act("finish", `{"result":${encodeSized(result)}}`);
  }

  /** running or resuming → failed, with the error's text. */
  fail(error: unknown): Promise<this> {
    return this.act("fail", `{"error":${encode(errorText(error))}}`);
  }
}

export class Sessions {
  /** @internal */
  constructor(private readonly http: Http, private readonly turns_: UpdateTurns) {}

  /** A new session owned by this client's principal. */
  async create(opts: { metadata?: JsonObject } = {}): Promise<SessionInfo> {
    const m = opts.metadata ?? {};
    if (typeof m !== "object" || m === null || Array.isArray(m)) throw new InvalidValue("metadata must be an object");
    return toSession(await this.http.call<WireSession>(S.create, {}, { json: `{"metadata":${encodeSized(m)}}` }));
  }

  /** :throws NotFound (unknown, or not this principal's) */
  async get(sessionId: string): Promise<SessionInfo> {
    return toSession(await this.http.call<WireSession>(S.get, sid(sessionId)));
  }

  /** This principal's sessions (all of them for an admin), newest first. */
  async list(opts: { after?: string; limit?: number } = {}): Promise<SessionInfo[]> {
    const q = page(opts);
    if (q.limit === 0) return [];
    return (await this.http.call<WireSessions>(S.list, {}, { query: q })).sessions.map(toSession);
  }

  /** Remove the session, its turns and its session-scope state. */
  async delete(sessionId: string): Promise<void> {
    await this.http.call<WireDeleted>(S.delete, sid(sessionId));
  }

  /**
   * Admins only: delete the sessions with no turn started for `idleFor` seconds and none
   * queued or running, with their turns and session-scope state; their ids.
   * :throws Forbidden (not an admin), InvalidValue
   */
  async prune(opts: { idleFor: number }): Promise<string[]> {
    const body = `{"idle_for":${checkAge("idleFor", opts?.idleFor)}}`;
    return (await this.http.call<WirePrunedSessions>(S.prune, {}, { json: body })).sessions;
  }

  /**
   * A new session of this client's principal whose state is the session's right after change
   * `at` (default: now), with no turns (SPEC §17); `metadata` defaults to the original's.
   * Cheap whatever the session holds (its lists are shared until written); a write to either
   * session never changes the other.
   * :throws NotFound (unknown, or not this principal's), CursorExpired, InvalidValue
   */
  async fork(sessionId: string, opts: { at?: number; metadata?: JsonObject } = {}): Promise<SessionInfo> {
    const params = sid(sessionId);
    const at = opts.at === undefined || opts.at === null ? "null" : String(checkInt("at", opts.at));
    const m = opts.metadata;
    if (m !== undefined && m !== null && (typeof m !== "object" || Array.isArray(m))) {
      throw new InvalidValue("metadata must be an object");
    }
    const body = `{"at":${at},"metadata":${m === undefined || m === null ? "null" : encodeSized(m)}}`;
    return toSession(await this.http.call<WireSession>(S.fork, params, { json: body }));
  }

  /** The session's own state (`session:{id}`), after the access check (NotFound). */
  async state(sessionId: string): Promise<Scope> {
    await this.get(sessionId);
    return new Scope(this.http, this.turns_, "session", sessionId, true);
  }

  /**
   * A new turn, `running` (or `queued`, started later with `turn.start()`).
   * :throws SessionBusy (`turnId`: the active turn), NotFound
   */
  async startTurn(sessionId: string, opts: { input?: unknown; lease?: number; queued?: boolean } = {}): Promise<Turn> {
    const params = sid(sessionId);
    const body = `{"input":${encodeSized(opts.input ?? null)},"lease":${checkSeconds("lease", opts.lease ?? 60)},` +
      `"queued":${opts.queued === true}}`;
    return new Turn(this.http, await this.http.call<WireTurn>(S.startTurn, params, { json: body }));
  }

  /**
   * Run `fn(turn)` in a new running turn: finished with fn's result when it
   * returns, failed with the error's text when it throws (the error is rethrown),
   * as Python's `with db.sessions.turn(...)`. A result that cannot be recorded (not
   * JSON, over 1 MiB) fails the turn with that error's text, and the error is thrown
   * (InvalidValue, TooLarge): the turn never stays running. A turn that `fn` moved itself
   * (held, finished, failed) is left as it is; one whose lease lapsed while `fn`
   * ran is not finished: InvalidTransition (call `turn.heartbeat()` in long work).
   */
  async turn<T>(sessionId: string, fn: (turn: Turn) => T | Promise<T>,
    opts: { input?: unknown; lease?: number } = {}): Promise<T> {
    const t = await this.startTurn(sessionId, opts);
    let result: T;
    try {
      result = await fn(t);
    } catch (e) {
      try {
        if (["running", "resuming"].includes((await t.refresh()).status)) await t.fail(e);
      } catch {
        // The caller's error is what propagates, whatever recording it meets.
      }
      throw e;
    }
    const status = (await t.refresh()).status;
    if (status === "running" || status === "resuming") {
      try {
        await t.finish(result === undefined ? null : result);
      } catch (e) {
        // Refused, by this client or the server: nothing was recorded, so the turn is failed
        // with why, rather than left running until its lease lapses (SessionBusy meanwhile).
        if (e instanceof InvalidValue || e instanceof TooLarge) await t.fail(e).catch(() => undefined);
        throw e;
      }
    } else if (status === "expired") {
      throw new InvalidTransition(`turn ${t.id} expired before its function returned (its lease of ` +
        `${t.lease} s lapsed; call turn.heartbeat() in long work): it is not finished`);
    }
    return result;
  }

  async getTurn(turnId: string): Promise<Turn> {
    return new Turn(this.http, await this.http.call<WireTurn>(S.getTurn, tid(turnId)));
  }

  /** The session's turns, newest first. */
  async turns(sessionId: string, opts: { after?: string; limit?: number } = {}): Promise<Turn[]> {
    const params = sid(sessionId);
    const q = page(opts);
    if (q.limit === 0) return [];
    return (await this.http.call<WireTurns>(S.turns, params, { query: q })).turns.map((d) => new Turn(this.http, d));
  }

  /** Turns in these states across this principal's sessions (an admin's: all); default every open state and expired. */
  async turnsByStatus(status?: TurnStatus | TurnStatus[], opts: { after?: string; limit?: number } = {}): Promise<Turn[]> {
    const q = { ...page(opts), status: status === undefined ? undefined : [status].flat().join(",") };
    if (q.limit === 0) return [];
    return (await this.http.call<WireTurns>(S.turnsByStatus, {}, { query: q })).turns.map((d) => new Turn(this.http, d));
  }

  /** held → decided, with the decision. */
  async decide(turnId: string, decision: unknown): Promise<Turn> {
    const params = { ...tid(turnId), action: "decide" };
    return new Turn(this.http, await this.http.call<WireTurn>(S.act, params, { json: `{"decision":${encodeSized(decision)}}` }));
  }

  /** decided → resuming, with a new lease (allowed while a newer turn runs). */
  async resume(turnId: string, opts: { lease?: number } = {}): Promise<Turn> {
    const params = { ...tid(turnId), action: "resume" };
    const lease = opts.lease === undefined ? "null" : checkSeconds("lease", opts.lease);
    return new Turn(this.http, await this.http.call<WireTurn>(S.act, params, { json: `{"lease":${lease}}` }));
  }

  /** Admins only: end the session's active turn as failed. :throws Forbidden */
  async release(sessionId: string): Promise<Turn> {
    return new Turn(this.http, await this.http.call<WireTurn>(S.release, sid(sessionId)));
  }
}
