/**
 * The feed at its edges (SPEC §16): a page of changes the caller may not see, one event
 * stream shared by all of a client's subscriptions (across a server restart), and a
 * subscription whose stream keeps failing, which ends with the error.
 */

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, before, describe, it } from "node:test";

import { Busy, Forbidden, StorageError, Unauthorized, connect, type Change, type Database, type FeedFilter, type Fetch } from "agentstate-db";
import { json, serve as fake } from "./fake.js";
import { PyWorker, fresh, serve, type Served } from "./server.js";

let srv: Served;
let db: Database;
let worker: PyWorker;

before(async () => {
  srv = await serve();
  db = connect(srv.url, { token: srv.token });
  worker = new PyWorker(srv.db);
});
after(async () => {
  await worker?.close();
  await srv?.close();
});

/** Resolves after `ms`. */
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe("changes() and a page of changes the caller may not see", () => {
  it("goes on from where the server read, to the changes it may see, or to the head", async () => {
    // Another principal's session: the admin's, whose changes bob may not see.
    const hidden = await db.sessions.create();
    const state = await db.sessions.state(hidden.id);
    const bob = connect(srv.url, { token: srv.userToken });
    const head = await db.lastChange();
    for (let i = 0; i < 25; i++) await state.put(`k${i}`, i);
    // Only what is hidden: [] at the head, at once (nothing to wait for).
    assert.deepEqual(await bob.changes({ since: head, limit: 10 }), []);
    const id = fresh("seen");
    await db.scope("app", id).put("k", 1);
    const got = await bob.changes({ since: head, limit: 10 });
    assert.deepEqual(got.map((c) => [c.kind, c.scopeId, c.key]), [["app", id, "k"]],
      "three pages of another's session, then the change bob may see");
    // Python's client agrees.
    const py = await worker.run(
      "import sys\nbob = agentstate.connect(inp['url'], token=inp['token'])\n" +
      "out = [[c.kind, c.scope_id, c.key] for c in bob.changes(since=inp['since'], limit=10)]",
      { url: srv.url, token: srv.userToken, since: head });
    assert.deepEqual(py, [["app", id, "k"]]);
  });
});

/** A fetch that counts the event streams it opened and how many were open at once. */
function countingStreams() {
  const n = { opened: 0, open: 0, most: 0 };
  const f: Fetch = async (url, init) => {
    const res = await fetch(url, init);
    if (!url.includes("/v1/changes/stream") || res.body === null) return res;
    n.opened++;
    n.most = Math.max(n.most, ++n.open);
    let closed = false;
    const close = () => { if (!closed) { closed = true; n.open--; } };
    const reader = res.body.getReader();
    const body = new ReadableStream<Uint8Array>({
      async pull(ctrl) {
        try {
          const { done, value } = await reader.read();
          if (done) { close(); ctrl.close(); } else ctrl.enqueue(value);
        } catch (e) { close(); ctrl.error(e); }
      },
      cancel(reason) { close(); return reader.cancel(reason); },
    });
    return new Response(body, { status: res.status, headers: res.headers });
  };
  return { n, fetch: f };
}

/** Every change after `since` that the filters match, by pages: what a subscription must deliver. */
async function expected(since: number, f: FeedFilter): Promise<number[]> {
  const out: number[] = [];
  for (;;) {
    const page = await db.changes({ since, ...f });
    if (page.length === 0) return out;
    out.push(...page.map((c) => c.seq));
    since = page[page.length - 1]!.seq;
  }
}

describe("one event stream per client", () => {
  it("serves many subscriptions with their own filters and cursors, each its changes once, across a restart", async () => {
    const counting = countingStreams();
    const client = connect(srv.url, { token: srv.token, fetch: counting.fetch });
    const x = fresh("x");
    const run = fresh("run");
    const head = await db.lastChange();
    const write = async (tag: string) => {
      await db.scope("app", x).put("k", tag);
      await db.scope("user", x).put("k", tag);
      await db.scope("app", x).append(`l-${tag}`, [tag]);
      await db.scope("agent", fresh()).put("other", tag);
    };
    await write("w1");
    await db.runs.write(run, [], { task: "feed" }, { create: true });
    const filters: [string, number, FeedFilter][] = [
      ["all", head, {}], ["app", head, { kind: "app" }], ["x", head, { scopeId: x }],
      ["key k", head, { key: "k" }], ["later since", head + 3, {}], ["runs", head, { topic: "run" }],
      ["from 0, app x", 0, { kind: "app", scopeId: x }], ["x, k", head, { scopeId: x, key: "k" }],
    ];
    const ac = new AbortController();
    const seen = new Map<string, number[]>();
    const loops: Promise<void>[] = [];
    const start = (name: string, since: number, f: FeedFilter) => {
      seen.set(name, []);
      loops.push((async () => {
        for await (const c of client.subscribe(since, { ...f, signal: ac.signal })) seen.get(name)!.push(c.seq);
      })());
    };
    for (const [name, since, f] of filters) start(name, since, f);
    await write("w2");
    await db.runs.write(run, [{ seq: 0, type: "note" }], null);
    // Wait until the stream has read past w2, then add one more subscription (from `head`: it
    // reads what the stream read before it joined by pages).
    const w2 = await db.lastChange();
    for (let i = 0; i < 600 && (seen.get("all")!.at(-1) ?? 0) < w2; i++) await sleep(50);
    start("joined late", head, {});
    await srv.stop();
    await worker.run("s = db.scope('app', inp)\ns.put('k', 'down')\ndb.scope('user', inp).put('k', 'down')", x);
    await srv.start();
    await write("w3");
    await db.runs.write(run, [{ seq: 1, type: "note" }], null);

    const want = new Map<string, number[]>();
    for (const [name, since, f] of [...filters, ["joined late", head, {}] as [string, number, FeedFilter]]) {
      want.set(name, await expected(since, f));
    }
    const done = () => [...want].every(([name, w]) => seen.get(name)!.length >= w.length);
    for (let i = 0; i < 1200 && !done(); i++) await sleep(50);
    ac.abort();
    await Promise.all(loops);
    for (const [name, w] of want) {
      assert.ok(w.length > 0, `${name} has changes to deliver`);
      assert.deepEqual(seen.get(name), w, `${name}: every change it matches, once, in order`);
    }
    assert.equal(counting.n.most, 1, "never more than one stream open");
    assert.ok(counting.n.opened >= 2, "reopened after the restart");
  });

  it("a browser's six connections: many subscriptions leave calls free to go", async () => {
    // undici, like a browser, could hold a few connections per host: with one stream per
    // subscription, ten would hold ten. Here they hold one, and a call still answers.
    const counting = countingStreams();
    const client = connect(srv.url, { token: srv.token, fetch: counting.fetch });
    const ac = new AbortController();
    const loops = Array.from({ length: 10 }, (_, i) => (async () => {
      for await (const _c of client.subscribe(undefined, { scopeId: `s-${i}`, signal: ac.signal })) { /* none */ }
    })());
    for (let i = 0; i < 200 && counting.n.opened === 0; i++) await sleep(25);
    assert.equal(await client.scope("app", fresh()).put("k", 1), 1);
    assert.deepEqual([counting.n.opened, counting.n.open], [1, 1]);
    ac.abort();
    await Promise.all(loops);
  });
});

/** Iterate a subscription until it ends: what it threw (null: it ended without an error). */
async function ending(client: Database, guardMs = 90_000): Promise<unknown> {
  const ac = new AbortController();
  const guard = setTimeout(() => ac.abort(), guardMs);
  try {
    for await (const _c of client.subscribe(0, { signal: ac.signal })) { /* none */ }
    return ac.signal.aborted ? new Error(`still retrying after ${guardMs} ms`) : null;
  } catch (e) {
    return e;
  } finally {
    clearTimeout(guard);
  }
}

/** A loopback port nothing listens on. */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

// Its cases mostly wait out back-offs and a timeout, each on a server of its own: run together.
describe("a subscription whose stream keeps failing", { concurrency: true }, () => {
  it("ends with a StorageError when nothing listens on the port", async () => {
    const t0 = performance.now();
    const e = await ending(connect(`http://127.0.0.1:${await closedPort()}`, { token: "t", timeout: 2 }));
    assert.ok(e instanceof StorageError, String(e));
    assert.ok(performance.now() - t0 >= 2000, "not before its attempts spanned the client's timeout");
  });

  it("past the stream cap (503 busy each time), ends with Busy after a bounded number of attempts", async () => {
    const srv503 = await fake((_q, res) => json(res, 503, { error: { code: "busy", message: "bob holds 64 long polls and streams open" } }));
    const e = await ending(connect(srv503.url, { token: "t", timeout: 2 }));
    assert.ok(e instanceof Busy, String(e));
    // Eight at least, and as many more as it takes to span the 2 s (the pauses grow to 2 s each).
    assert.ok(srv503.seen.length >= 8 && srv503.seen.length <= 12, `${srv503.seen.length} attempts`);
  });

  it("a server that ends every stream at once (a busy store) is given up too, with its error", async () => {
    const busy = await fake((_q, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(': agentstate change stream\n\nevent: error\ndata: {"error":{"code":"busy","message":"the store is busy"}}\n\n');
    });
    const e = await ending(connect(busy.url, { token: "t", timeout: 2 }));
    assert.ok(e instanceof Busy, String(e));
  });

  it("401 (and 403) end it at once", async () => {
    for (const [status, code, cls] of [[401, "unauthorized", Unauthorized], [403, "forbidden", Forbidden]] as const) {
      const f = await fake((_q, res) => json(res, status, { error: { code, message: "no" } }));
      const e = await ending(connect(f.url, { token: "t" }));
      assert.ok(e instanceof cls && (e as { status?: number }).status === status, String(e));
      assert.equal(f.seen.length, 1);
    }
  });

  it("against the real server, past a principal's cap of open streams: Busy", async () => {
    // 64 clients of bob, each with its own stream (one per client), fill bob's cap.
    const holders = Array.from({ length: 64 }, () => [connect(srv.url, { token: srv.userToken }), new AbortController()] as const);
    const loops = holders.map(([h, ac]) => (async () => {
      try {
        for await (const _c of h.subscribe(undefined, { signal: ac.signal })) { /* none */ }
      } catch { /* ended when the test ends */ }
    })());
    const bob = connect(srv.url, { token: srv.userToken });
    let full = false;
    for (let i = 0; i < 600 && !full; i++) {
      full = await bob.watch(await bob.lastChange(), { timeout: 0.01 }).then(() => false, (e) => e instanceof Busy);
      if (!full) await sleep(50);
    }
    assert.ok(full, "bob's 64 streams are open");
    const e = await ending(connect(srv.url, { token: srv.userToken, timeout: 2 }));
    for (const [, ac] of holders) ac.abort();
    await Promise.all(loops);
    assert.ok(e instanceof Busy, String(e));
  });
});
