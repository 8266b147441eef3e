/**
 * What the transport makes of answers that are not the server's, of no answer, and of a
 * server that hangs (SPEC §13, §16): each is one of the client's errors, a write's outcome
 * unknown; never Node's raw error, a proxy's page taken for stored bytes, or a stall.
 */

import assert from "node:assert/strict";
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer } from "node:net";
import { describe, it } from "node:test";

import {
  InvalidValue, NotFound, StorageError, TooLarge, UsageError, connect, type Database,
} from "agentstate-db";
import { failure, json, serve } from "./fake.js";

type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void;

const VERSIONED = { key: "k", value: 1, version: 1 };

/** Every write call of the client, each once, on `db`. */
function writes(db: Database): [string, () => Promise<unknown>][] {
  const s = db.scope("app", "x");
  return [
    ["put", () => s.put("k", 1)], ["putBytes", () => s.putBytes("k", new Uint8Array([1]))],
    ["delete", () => s.delete("k")], ["append", () => s.append("k", [1])], ["pop", () => s.pop("k")],
    ["touch", () => s.touch("k", 5)], ["clear", () => s.clear()], ["update", () => s.update<number>("k", (n) => (n ?? 0) + 1)],
    ["batch", () => { const b = db.batch(); b.scope("app", "x").put("k", 1); return b.commit(); }],
    ["runs.write", () => db.runs.write("r", [], null)], ["runs.delete", () => db.runs.delete("r")],
    ["runs.fork", () => db.runs.fork("r", "r2")], ["runs.trim", () => db.runs.trim("r", { before: 1 })],
    ["runs.pin", () => db.runs.pin("r")], ["runs.claim", () => db.runs.claim("r", "c")],
    ["runs.settle", () => db.runs.settle("r", "c", { result: 1 })],
    ["sessions.create", () => db.sessions.create()], ["sessions.delete", () => db.sessions.delete("s")],
    ["sessions.startTurn", () => db.sessions.startTurn("s")], ["sessions.decide", () => db.sessions.decide("t", 1)],
  ];
}

/** A server whose every GET of a key answers that key's value, and every write with `write`. */
const writesMeet = (write: Handler): Handler => (req, res, body) =>
  req.method === "GET" ? json(res, 200, VERSIONED) : write(req, res, body);

describe("answers that are not the server's own", () => {
  const proxies: [string, Handler][] = [
    ["a gateway's 502 page", (_q, res) => { res.writeHead(502, { "content-type": "text/html" }); res.end("<h1>Bad Gateway</h1>"); }],
    ["a 502 in another server's JSON", (_q, res) => json(res, 502, { error: { message: "upstream reset" } })],
    ["a 500 whose code is not agentstate's", (_q, res) => json(res, 500, { error: { code: 502, message: "x" } })],
    ["a proxy's HTML 200", (_q, res) => { res.writeHead(200, { "content-type": "text/html" }); res.end("<html>hi</html>"); }],
    ["an empty 200", (_q, res) => { res.writeHead(200); res.end(); }],
    ["a 200 of {}", (_q, res) => json(res, 200, {})],
    ["a 200 cut mid-body", (_q, res) => {
      res.writeHead(200, { "content-type": "application/json", "content-length": "100" });
      res.write('{"version":');
      setTimeout(() => res.destroy(), 20);
    }],
  ];
  for (const [what, answer] of proxies) {
    it(`every write that meets ${what} is a StorageError whose outcome is unknown`, async () => {
      const srv = await serve(writesMeet(answer));
      const db = connect(srv.url, { token: "t" });
      for (const [name, call] of writes(db)) {
        const e = await failure(call());
        assert.ok(e instanceof StorageError, `${name}: ${String(e)}`);
        assert.equal(e.outcomeUnknown, true, `${name}: ${e.message}`);
      }
      await srv.stop();
    });
  }

  it("a read that meets one is a StorageError whose outcome is known", async () => {
    for (const [what, answer] of proxies) {
      const srv = await serve(answer);
      const e = await failure(connect(srv.url, { token: "t" }).scope("app", "x").get("k"));
      assert.ok(e instanceof StorageError && e.outcomeUnknown === false, `${what}: ${String(e)}`);
      await srv.stop();
    }
  });

  it("update() whose write meets a 502 says its outcome is unknown, having read the value fine", async () => {
    const srv = await serve(writesMeet((_q, res) => json(res, 502, { error: { message: "bad gateway" } })));
    const e = await failure(connect(srv.url, { token: "t" }).scope("app", "x").update<number>("k", (n) => (n ?? 0) + 1));
    assert.ok(e instanceof StorageError && e.outcomeUnknown === true, String(e));
    assert.deepEqual(srv.seen.map((q) => q.method), ["GET", "PUT"]);
  });

  it("unknown_route (a proxy prefix not stripped) is a StorageError, never an absent key, run or session", async () => {
    const srv = await serve((req, res) => json(res, 404, { error: { code: "unknown_route", message: `${req.method} ${req.url}: no route` } }));
    const db = connect(srv.url, { token: "t" });
    const s = db.scope("app", "x");
    for (const [what, call] of [["get", () => s.get("k")], ["getVersioned", () => s.getVersioned("k")],
      ["getBytes", () => s.getBytes("k")], ["runs.read", () => db.runs.read("r")], ["runs.head", () => db.runs.head("r")],
      ["sessions.get", () => db.sessions.get("s")], ["delete", () => s.delete("k")]] as const) {
      const e = await failure(call());
      assert.ok(e instanceof StorageError && !(e instanceof NotFound), `${what}: ${String(e)}`);
      assert.equal(e.outcomeUnknown, false, `${what}: the server routed it nowhere, so nothing was done`);
      assert.match(e.message, /no such route/);
    }
  });
});

describe("getBytes", () => {
  const bytesOf = async (answer: Handler) => {
    const srv = await serve(answer);
    try {
      return await connect(srv.url, { token: "t" }).scope("app", "x").getBytes("k").catch((e: unknown) => e);
    } finally {
      await srv.stop();
    }
  };

  it("an answer cut mid-body is a StorageError, not the platform's TypeError", async () => {
    const e = await bytesOf((_q, res) => {
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": "1000" });
      res.write(Buffer.alloc(10, 7));
      setTimeout(() => res.destroy(), 20);
    });
    assert.ok(e instanceof StorageError, String(e));
    assert.match(e.message, /GET http:\/\/127\.0\.0\.1:\d+\/v1\/scopes\/app\/x\/keys\/k: the answer was cut/);
  });

  for (const [what, answer] of [
    ["a proxy's HTML 200", (_q: IncomingMessage, res: ServerResponse) => { res.writeHead(200, { "content-type": "text/html" }); res.end("<html>login</html>"); }],
    ["a JSON 200 (the Accept header dropped on the way)", (_q: IncomingMessage, res: ServerResponse) => json(res, 200, VERSIONED)],
    ["an empty 200 without a type", (_q: IncomingMessage, res: ServerResponse) => { res.writeHead(200); res.end(); }],
  ] as const) {
    it(`${what} is a StorageError, not the stored bytes`, async () => {
      const e = await bytesOf(answer);
      assert.ok(e instanceof StorageError, `${String(e)}`);
    });
  }

  it("stored bytes, empty ones too, come back as they are; an absent key is null", async () => {
    for (const data of [new Uint8Array([0, 255, 10]), new Uint8Array(0)]) {
      const got = await bytesOf((_q, res) => {
        res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(data.length) });
        res.end(Buffer.from(data));
      });
      assert.deepEqual(got, data);
    }
    assert.equal(await bytesOf((_q, res) => json(res, 404, { error: { code: "not_found", message: "no key" } })), null);
  });
});

/** A loopback port that accepts connections and never answers (a hung server). */
async function hung(): Promise<{ url: string; stop: () => Promise<void> }> {
  const sockets = new Set<import("node:net").Socket>();
  const server = createServer((sock) => { sockets.add(sock); sock.on("error", () => undefined); });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const addr = server.address();
  if (typeof addr !== "object" || addr === null) throw new Error("no address");
  return {
    url: `http://127.0.0.1:${addr.port}`,
    stop: () => new Promise<void>((resolve) => { for (const s of sockets) s.destroy(); server.close(() => resolve()); }),
  };
}

describe("timeout", () => {
  it("a hung server fails a call with a StorageError after the timeout, not before; a write's outcome unknown", async () => {
    const srv = await hung();
    const db = connect(srv.url, { token: "t", timeout: 0.3 });
    const t0 = performance.now();
    const r = await failure(db.scope("app", "x").get("k"));
    assert.ok(performance.now() - t0 >= 300, "not before the timeout");
    assert.ok(r instanceof StorageError && r.outcomeUnknown === false, String(r));
    assert.match(r.message, /within 0\.3 s/);
    const w = await failure(db.scope("app", "x").put("k", 1));
    assert.ok(w instanceof StorageError && w.outcomeUnknown === true, String(w));
    await srv.stop();
  });

  it("an answer whose body stops coming is a StorageError after the timeout", async () => {
    const srv = await serve((_q, res) => {
      res.writeHead(200, { "content-type": "application/json", "content-length": "1000" });
      res.write('{"key":"k",'); // and nothing more
    });
    const e = await failure(connect(srv.url, { token: "t", timeout: 0.3 }).scope("app", "x").get("k"));
    assert.ok(e instanceof StorageError, String(e));
    assert.match(e.message, /within 0\.3 s/);
    await srv.stop();
  });

  it("a long poll gets its wait on top of the timeout", async () => {
    // A fetch that never answers: when is the request given up?
    const aborted: number[] = [];
    const t0 = performance.now();
    const never = (_url: string, init?: RequestInit): Promise<Response> => new Promise((_resolve, reject) => {
      init?.signal?.addEventListener("abort", () => {
        aborted.push(performance.now() - t0);
        reject(new DOMException("aborted", "AbortError"));
      });
    });
    const db = connect("http://x.invalid", { token: "t", timeout: 0.5, fetch: never });
    const e = await failure(db.watch(0, { timeout: 1 }));
    assert.ok(e instanceof StorageError, String(e));
    assert.equal(aborted.length, 1);
    // The wait asked (1 s, less the few ms already gone) and the timeout (0.5 s); the timeout
    // alone would give up at 0.5 s.
    assert.ok(aborted[0]! >= 1400, `given up after ${aborted[0]} ms`);
  });

  it("is seconds, default 30, and must be a number of seconds over 0", async () => {
    let signal: AbortSignal | undefined;
    const db = connect("http://x.invalid", { token: "t", fetch: async (_u, init) => {
      signal = init?.signal ?? undefined;
      return new Response(JSON.stringify(VERSIONED), { headers: { "content-type": "application/json" } });
    } });
    assert.equal(await db.scope("app", "x").get("k"), 1);
    assert.ok(signal instanceof AbortSignal, "every call carries a signal that ends it");
    for (const bad of [0, -1, NaN, Infinity, "30"]) {
      assert.throws(() => connect("http://h", { token: "t", timeout: bad as number }), InvalidValue, String(bad));
    }
  });
});

describe("error messages", () => {
  it("name the real path with the key, never the route's template", async () => {
    const srv = await serve((_q, res) => json(res, 502, { error: { message: "upstream" } }));
    const db = connect(srv.url, { token: "t" });
    const e = await failure(db.scope("session", "s-1").put("my-key", 1));
    assert.ok(e instanceof StorageError);
    assert.ok(e.message.startsWith(`PUT ${srv.url}/v1/scopes/session/s-1/keys/my-key: `), e.message);
    await srv.stop();
    const down = await failure(db.runs.read("run-9"));
    assert.ok(down instanceof StorageError);
    assert.ok(down.message.startsWith(`GET ${srv.url}/v1/runs/run-9: `), down.message);
    assert.ok(!/\{\w+\}/.test(e.message + down.message), e.message + down.message);
  });
});

describe("a relative base URL", () => {
  it("is resolved against the page's location where there is one (a same-origin page)", () => {
    const g = globalThis as { location?: unknown };
    assert.equal(g.location, undefined, "Node has no location");
    g.location = { href: "https://app.example/agents/page.html?x=1#top" };
    try {
      assert.equal(connect("/state", { token: "t" }).url, "https://app.example/state");
      assert.equal(connect("api/", { token: "t" }).url, "https://app.example/agents/api");
      assert.throws(() => connect("//user:pw@other.example/", { token: "t" }), InvalidValue);
    } finally {
      delete g.location;
    }
  });

  it("is refused with a UsageError where there is no page", () => {
    const e = (() => { try { connect("/state", { token: "t" }); } catch (x) { return x; } return null; })();
    assert.ok(e instanceof UsageError, String(e));
    assert.match(e.message, /relative URL/);
  });
});

describe("values over the size limit", () => {
  const MiB = 1024 * 1024;
  /** A value whose compact UTF-8 JSON is `n` bytes: a string of "é" (2 bytes each) and quotes. */
  const sized = (n: number) => "é".repeat((n - 2) >> 1) + ((n - 2) % 2 ? "a" : "");

  it("are TooLarge before anything is sent, with the value's size and the 1 MiB limit", async () => {
    const seen: string[] = [];
    const db = connect("http://x.invalid", { token: "t", fetch: async (url, init) => {
      seen.push(`${init?.method} ${url}`);
      return new Response(JSON.stringify({ ...VERSIONED, length: 1, results: [] }), { headers: { "content-type": "application/json" } });
    } });
    const s = db.scope("app", "x");
    const over = sized(MiB + 1);
    const cases: [string, () => Promise<unknown>, number][] = [
      ["put", () => s.put("k", over), MiB + 1],
      ["put, 5 MiB (past the server's body limit)", () => s.put("k", "x".repeat(5 * MiB)), 5 * MiB + 2],
      ["update", () => s.update("k", () => over), MiB + 1],
      ["putBytes", () => s.putBytes("k", new Uint8Array(MiB + 1)), MiB + 1],
      // a list counts as the JSON of the whole list: [ "…" ] is 2 bytes more than the string
      ["append", () => s.append("k", [sized(MiB - 1)]), MiB + 1],
      ["batch put", async () => db.batch().scope("app", "x").put("k", over), MiB + 1],
      ["turn input", () => db.sessions.startTurn("s", { input: over }), MiB + 1],
    ];
    for (const [what, call, size] of cases) {
      const e = await failure(call());
      assert.ok(e instanceof TooLarge, `${what}: ${String(e)}`);
      assert.deepEqual([e.size, e.limit], [size, MiB], what);
    }
    assert.deepEqual(seen.filter((r) => !r.startsWith("GET")), [], "no write was sent");
    // Exactly at the limit is a value like any other.
    await s.put("k", sized(MiB));
    await s.putBytes("k", new Uint8Array(MiB));
    assert.equal(seen.filter((r) => r.startsWith("PUT")).length, 2);
  });
});
