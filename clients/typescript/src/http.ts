/**
 * The transport: one `fetch` per call, built from the route table, with the
 * token, the acting principal, and the server's errors turned into classes.
 * Only the platform's `fetch` is used (or the one given to `connect`), so
 * the client runs in Node 18+, Deno, Bun, browsers and edge workers.
 */

import { AgentStateError, NotFound, StorageError, UsageError, fromBody } from "./errors.js";
import { parse, parseAnswer } from "./json.js";
import { misfit, type Route } from "./wire.js";

export type Fetch = (input: string, init?: RequestInit) => Promise<Response>;
export type Query = Record<string, string | number | boolean | null | undefined>;

export interface CallOptions {
  query?: Query;
  /** A JSON body, already encoded. */
  json?: string;
  /** A bytes body (application/octet-stream). */
  bytes?: Uint8Array;
  /** Ask for the raw bytes of the answer. */
  raw?: boolean;
  /** A turn id: the write lands only while that turn holds its lease (SPEC §14). */
  fence?: string;
  signal?: AbortSignal;
  /** Seconds the server may hold the answer on purpose (a long poll's wait): added to the timeout. */
  wait?: number;
}

/** The longest a timer may be set for (setTimeout's own limit, about 24.8 days). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * One path segment. Ids and keys are only `A-Z a-z 0-9 . _ : -`, so nothing
 * needs escaping but `:` and the segments "." and "..", which every URL
 * parser (fetch's included, even written `%2E`) removes as dot segments.
 * Those are sent as `~.` and `~..`: `~` is never part of a key, so the
 * escape cannot be taken for another key (SPEC §13; see README, "Keys").
 */
export function segment(p: string): string {
  return p === "." || p === ".." ? "~" + p : encodeURIComponent(p);
}

export function fill(path: string, params: Record<string, string>): string {
  return path.replace(/\{(\w+)\}/g, (_, name: string) => {
    const v = params[name];
    if (v === undefined) throw new Error(`no value for {${name}} in ${path}`);
    return segment(v);
  });
}

/** The HTTP status of the answer each error was made from (none: the request got no answer). */
const answered = new WeakMap<object, number>();

/** The HTTP status of the answer `e` was made from; undefined for a network failure or a client's own error. */
export function answerStatus(e: unknown): number | undefined {
  return typeof e === "object" && e !== null ? answered.get(e) : undefined;
}

function fromAnswer<E extends Error>(status: number, e: E): E {
  answered.set(e, status);
  return e;
}

/**
 * The time one call may take: its signal aborts the request when `seconds` pass (then
 * `expired` is true) or when the caller's own signal aborts.
 */
class Deadline {
  readonly signal: AbortSignal;
  expired = false;
  private readonly ctrl = new AbortController();
  private readonly timer: ReturnType<typeof setTimeout>;
  private readonly onAbort = () => this.ctrl.abort(this.outer?.reason);

  constructor(readonly seconds: number, private readonly outer: AbortSignal | undefined) {
    this.signal = this.ctrl.signal;
    this.timer = setTimeout(() => {
      this.expired = true;
      this.ctrl.abort();
    }, Math.min(MAX_TIMER_MS, seconds * 1000));
    if (outer?.aborted) this.ctrl.abort(outer.reason);
    else outer?.addEventListener("abort", this.onAbort, { once: true });
  }

  /** The answer is complete: neither the timer nor the caller's signal concerns it any more. */
  done(): void {
    clearTimeout(this.timer);
    this.outer?.removeEventListener("abort", this.onAbort);
  }

  /** A stream is open: no more timer (its own idle check takes over); the caller's signal still ends it. */
  opened(): void {
    clearTimeout(this.timer);
  }
}

export class Http {
  readonly base: string;
  /** Seconds one call may take (connect's `timeout`). */
  readonly timeout: number;
  // A private field: printing a client (console.log, util.inspect) never shows the token.
  readonly #headers: Record<string, string>;
  readonly #token: string;
  private readonly fetch: Fetch;

  constructor(url: string, token: string, principal: string | undefined, fetchImpl: Fetch | undefined,
    timeout = 30) {
    this.base = url.replace(/\/+$/, "");
    this.timeout = timeout;
    this.#token = token;
    this.#headers = { authorization: `Bearer ${token}` };
    if (principal !== undefined) this.#headers["x-agentstate-principal"] = principal;
    const f = fetchImpl ?? (globalThis.fetch as Fetch | undefined);
    if (typeof f !== "function") throw new UsageError("this platform has no fetch: pass connect(url, { fetch })");
    // Called unbound: a platform fetch taken off globalThis may refuse another `this`.
    this.fetch = fetchImpl ?? ((input, init) => globalThis.fetch(input, init));
  }

  url(route: Route, params: Record<string, string>, query?: Query): string {
    let u = this.base + fill(route.path, params);
    if (query) {
      const parts: string[] = [];
      for (const [k, v] of Object.entries(query)) {
        if (v !== undefined && v !== null) parts.push(`${k}=${encodeURIComponent(String(v))}`);
      }
      if (parts.length) u += "?" + parts.join("&");
    }
    return u;
  }

  /** What error messages name a call by: its method and its real path (the key, not `{key}`). */
  where(route: Route, params: Record<string, string>): string {
    return `${route.method} ${this.base}${fill(route.path, params)}`;
  }

  /**
   * One call: the request, the server's error if it answered one, then `read` of the answer,
   * all within the timeout (plus `o.wait`). Whatever fails on the way is one of our errors:
   * no answer, a cut answer or the timeout is a StorageError (a write's outcome unknown).
   * `stream`: the answer is a stream that stays open past the call (the timer stops at its headers).
   */
  private async exchange<T>(route: Route, params: Record<string, string>, o: CallOptions,
    read: (res: Response, where: string) => Promise<T>, stream = false): Promise<T> {
    const headers: Record<string, string> = { ...this.#headers };
    let body: string | Uint8Array | undefined;
    if (o.json !== undefined) {
      headers["content-type"] = "application/json";
      body = o.json;
    } else if (o.bytes !== undefined) {
      headers["content-type"] = "application/octet-stream";
      body = o.bytes;
    }
    if (o.raw) headers.accept = "application/octet-stream";
    if (o.fence !== undefined) {
      if (route.fence !== true) throw new Error(`${route.method} ${route.path} is not a fenced write`);
      headers["x-agentstate-fence"] = o.fence;
    }
    const write = route.method !== "GET";
    const where = this.where(route, params);
    const url = this.url(route, params, o.query);
    if (!buildable(url, headers)) {
      // Nothing was sent (not in doubt), and the platform's message would show the header's value.
      throw new UsageError(`${where}: the request cannot be built ` +
        "(a header value or the URL cannot be sent); nothing was sent");
    }
    const limit = new Deadline(this.timeout + (o.wait ?? 0), o.signal);
    let open = false;
    try {
      let res: Response;
      try {
        // A redirect is never followed: fetch would send the token, the principal, the fence
        // and a write's body to wherever it points (or turn a write into a GET there, 303).
        res = await this.fetch(url, {
          method: route.method, headers, body: body as BodyInit | undefined, signal: limit.signal, redirect: "manual" });
      } catch (e) {
        // The request may have reached the server and been done: a write's outcome is unknown.
        throw this.failed(e, `${where}: `, write, limit, o.signal);
      }
      if (res.type === "opaqueredirect" || (res.status >= 300 && res.status < 400)) {
        // agentstate never redirects: what answered is not the store, so nothing was done.
        res.body?.cancel().catch(() => undefined);
        throw fromAnswer(res.status || 302, new StorageError(`${where}: the server ` +
          `answered ${res.status || "a redirect"}${redirectTarget(res)}, which is not followed: connect() to the URL ` +
          "agentstate serves", false));
      }
      if (res.status >= 400) {
        let data: unknown = null;
        try {
          data = parseAnswer(await res.text(), false);
        } catch (e) {
          if (o.signal?.aborted || limit.expired) throw this.failed(e, `${where}: `, write, limit, o.signal);
          data = null; // a cut or unreadable body: not the server's own error
        }
        throw fromAnswer(res.status, fromBody(res.status, data, route.run === true, write, where));
      }
      try {
        const out = await read(res, where);
        open = stream;
        return out;
      } catch (e) {
        if (e instanceof AgentStateError) throw e;
        throw this.failed(e, `${where}: the answer was cut: `, write, limit, o.signal);
      }
    } finally {
      if (open) limit.opened();
      else limit.done();
    }
  }

  /** The error for a request that got no (whole) answer: the caller's abort, the timeout, the network. */
  private failed(e: unknown, prefix: string, write: boolean, limit: Deadline, signal: AbortSignal | undefined): unknown {
    if (signal?.aborted) return signal.reason;
    if (limit.expired) {
      return new StorageError(`${prefix}no complete answer within ${limit.seconds} s (connect's timeout` +
        `${limit.seconds > this.timeout ? ", and the long poll's wait" : ""})`, write);
    }
    const why = e instanceof Error ? `${e.name}: ${e.message}${causeOf(e)}` : String(e);
    // An injected fetch's text may hold the request's headers: never the token in an error.
    return new StorageError(`${prefix}${redact(why, this.#token)}`, write);
  }

  /** Call a route; its answer's text. */
  text(route: Route, params: Record<string, string>, o: CallOptions = {}): Promise<string> {
    return this.exchange(route, params, o, (res) => res.text());
  }

  /**
   * Call a route and parse its JSON answer, which must have the fields its route's answer
   * has (a proxy's page, `{}` or a cut answer is a StorageError, a write's outcome unknown).
   */
  async call<T>(route: Route, params: Record<string, string>, o: CallOptions = {}): Promise<T> {
    const write = route.method !== "GET";
    const text = await this.text(route, params, o);
    let d: unknown;
    try {
      d = parse(text);
    } catch (e) {
      throw new StorageError(`${this.where(route, params)}: the answer is not JSON (${(e as Error).message})`, write);
    }
    const wrong = misfit(d, route.answer);
    if (wrong !== null) {
      throw new StorageError(`${this.where(route, params)}: the answer is not agentstate's (${wrong})`, write);
    }
    return d as T;
  }

  /** Call a route; null when it answers that the key (or run, session, turn) is not there. */
  async maybe<T>(route: Route, params: Record<string, string>, o: CallOptions = {}): Promise<T | null> {
    try {
      return await this.call<T>(route, params, o);
    } catch (e) {
      if (e instanceof NotFound) return null;
      throw e;
    }
  }

  /**
   * Call a route that answers raw bytes (application/octet-stream): what the server sent, whole.
   * Another answer (a proxy's page, JSON, a body without that type) is a StorageError.
   */
  bytes(route: Route, params: Record<string, string>, o: CallOptions = {}): Promise<Uint8Array> {
    return this.exchange(route, params, { ...o, raw: true }, async (res, where) => {
      const type = res.headers.get("content-type") ?? "";
      if (!/^application\/octet-stream\b/i.test(type)) {
        res.body?.cancel().catch(() => undefined);
        throw new StorageError(`${where}: the answer is not stored bytes (its type is ${JSON.stringify(type || "none")}, ` +
          "not application/octet-stream)", route.method !== "GET");
      }
      const data = new Uint8Array(await res.arrayBuffer());
      const declared = res.headers.get("content-length");
      if (declared !== null && /^\d+$/.test(declared) && Number(declared) !== data.length) {
        throw new StorageError(`${where}: the answer was cut (${data.length} of ${declared} bytes)`,
          route.method !== "GET");
      }
      return data;
    });
  }

  /**
   * Open a stream of server-sent events: the answer, once its headers came (within the
   * timeout); `o.signal` ends it. Another answer than text/event-stream is a StorageError.
   */
  stream(route: Route, params: Record<string, string>, o: CallOptions = {}): Promise<ReadableStream<Uint8Array>> {
    return this.exchange(route, params, o, async (res, where) => {
      const type = res.headers.get("content-type") ?? "";
      if (!/^text\/event-stream\b/i.test(type) || res.body === null) {
        res.body?.cancel().catch(() => undefined);
        throw fromAnswer(res.status, new StorageError(`${where}: the answer is not an event stream ` +
          `(its type is ${JSON.stringify(type || "none")})`, false));
      }
      return res.body;
    }, true);
  }
}

/** `text` without `token` (a toy token of a few letters: only where it follows "Bearer "). */
function redact(text: string, token: string): string {
  return text.split(token.length >= 8 ? token : `Bearer ${token}`).join("***");
}

/** Whether fetch can build this request: a URL it parses, header values it can send. */
function buildable(url: string, headers: Record<string, string>): boolean {
  try {
    new URL(url);
    if (typeof Headers === "function") new Headers(headers); // the platform's own header check
    return true;
  } catch {
    return false;
  }
}

function causeOf(e: Error): string {
  const c = (e as { cause?: unknown }).cause;
  return c instanceof Error ? ` (${c.message})` : "";
}

/** " to ORIGIN" of a redirect's Location, when readable (only the origin: never a path's or userinfo's text). */
function redirectTarget(res: Response): string {
  const loc = res.headers.get("location");
  if (!loc) return "";
  try {
    return ` to ${new URL(loc).origin}`;
  } catch {
    return "";
  }
}
