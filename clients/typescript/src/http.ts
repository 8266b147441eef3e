/**
 * The transport: one `fetch` per call, built from the route table, with the
 * token, the acting principal, and the server's errors turned into classes.
 * Only the platform's `fetch` is used (or the one given to `connect`), so
 * the client runs in Node 18+, Deno, Bun, browsers and edge workers.
 */

import { AgentStateError, StorageError, UsageError, fromBody } from "./errors.js";
import { parseAnswer } from "./json.js";
import type { Route } from "./wire.js";

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
}

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

export class Http {
  readonly base: string;
  // A private field: printing a client (console.log, util.inspect) never shows the token.
  readonly #headers: Record<string, string>;
  readonly #token: string;
  private readonly fetch: Fetch;

  constructor(url: string, token: string, principal: string | undefined, fetchImpl: Fetch | undefined) {
    this.base = url.replace(/\/+$/, "");
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

  /** Send the request; the answer, or the server's error. */
  async send(route: Route, params: Record<string, string>, o: CallOptions = {}): Promise<Response> {
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
    const url = this.url(route, params, o.query);
    if (!buildable(url, headers)) {
      // Nothing was sent (not in doubt), and the platform's message would show the header's value.
      throw new UsageError(`${route.method} ${this.base}${route.path}: the request cannot be built ` +
        "(a header value or the URL cannot be sent); nothing was sent");
    }
    let res: Response;
    try {
      // A redirect is never followed: fetch would send the token, the principal, the fence
      // and a write's body to wherever it points (or turn a write into a GET there, 303).
      res = await this.fetch(url, {
        method: route.method, headers, body: body as BodyInit | undefined, signal: o.signal, redirect: "manual" });
    } catch (e) {
      if (o.signal?.aborted) throw o.signal.reason;
      // The request may have reached the server and been done: a write's outcome is unknown.
      const why = e instanceof Error ? `${e.name}: ${e.message}${causeOf(e)}` : String(e);
      // An injected fetch's text may hold the request's headers: never the token in an error.
      throw new StorageError(`${route.method} ${this.base}${route.path}: ${redact(why, this.#token)}`, write);
    }
    if (res.type === "opaqueredirect" || (res.status >= 300 && res.status < 400)) {
      // agentstate never redirects: what answered is not the store, so nothing was done.
      res.body?.cancel().catch(() => undefined);
      throw fromAnswer(res.status || 302, new StorageError(`${route.method} ${this.base}${route.path}: the server ` +
        `answered ${res.status || "a redirect"}${redirectTarget(res)}, which is not followed: connect() to the URL ` +
        "agentstate serves", false));
    }
    if (res.status >= 400) {
      let data: unknown = null;
      try {
        data = parseAnswer(await res.text(), false);
      } catch {
        data = null;
      }
      throw fromAnswer(res.status, fromBody(res.status, data, route.run === true, write));
    }
    return res;
  }

  /** Call a route; its answer's text. */
  async text(route: Route, params: Record<string, string>, o: CallOptions = {}): Promise<string> {
    const res = await this.send(route, params, o);
    try {
      return await res.text();
    } catch (e) {
      if (o.signal?.aborted) throw o.signal.reason;
      throw new StorageError(`${route.method} ${route.path}: the answer was cut (${String(e)})`,
        route.method !== "GET");
    }
  }

  /** Call a route and parse its JSON answer. */
  async call<T>(route: Route, params: Record<string, string>, o: CallOptions = {}): Promise<T> {
    return parseAnswer(await this.text(route, params, o), route.method !== "GET") as T;
  }

  /** Call a route; null when it answers 404 (an absent key or run). */
  async maybe<T>(route: Route, params: Record<string, string>, o: CallOptions = {}): Promise<T | null> {
    try {
      return await this.call<T>(route, params, o);
    } catch (e) {
      if (e instanceof AgentStateError && e.status === 404) return null;
      throw e;
    }
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
