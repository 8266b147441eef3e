/**
 * Every method of SPEC §13 against a real `agentstate serve`, and the errors
 * the server gives, as the classes of §6.
 */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  AgentStateError, CursorExpired, Forbidden, HistoryGap, InvalidKey, InvalidTransition, InvalidValue, NotAList, NotFound,
  RunExists, RunNotFound, SessionBusy, StorageError, TooLarge, Turn, Unauthorized, VersionConflict, connect,
  type Change, type Database,
} from "agentstate-db";
import { disagreements, type Doc } from "./openapi.js";
import { fresh, python, served, type Served } from "./server.js";

let srv: Served;
let db: Database;
served((s, d) => {
  [srv, db] = [s, d];
});

describe("scopes", () => {
  it("get, getVersioned, put, delete with ifVersion", async () => {
    const s = db.scope("agent", fresh());
    assert.equal(await s.get("k"), undefined);
    assert.equal(await s.get("k", 5), 5);
    assert.deepEqual(await s.getVersioned("k"), { value: undefined, version: 0 });
    assert.equal(await s.put("k", { a: [1, "two", null, true] }, { ifVersion: 0 }), 1);
    assert.deepEqual(await s.get("k"), { a: [1, "two", null, true] });
    assert.deepEqual(await s.getVersioned("k"), { value: { a: [1, "two", null, true] }, version: 1 });
    const err = await s.put("k", 2, { ifVersion: 0 }).catch((e: unknown) => e);
    assert.ok(err instanceof VersionConflict);
    assert.equal(err.currentVersion, 1);
    assert.equal(await s.put("k", 2, { ifVersion: 1 }), 2);
    for (const stored of [0, "", [], false, null]) {
      await s.put("z", stored);
      assert.deepEqual(await s.get("z", "default"), stored, "a stored falsy value is not the default");
    }
    await assert.rejects(s.delete("k", { ifVersion: 1 }), VersionConflict);
    assert.equal(await s.delete("k", { ifVersion: 2 }), true);
    assert.equal(await s.delete("k"), false);
    assert.equal(await s.delete("k", { ifVersion: 0 }), false);
    assert.ok((await s.put("k", "again")) > 2, "versions are never reused after a delete");
  });

  it("update: sync and async functions, default only when absent, expiry kept", async () => {
    const s = db.scope("user", fresh());
    assert.equal(await s.update<number>("visits", (n) => n + 1, { default: 0 }), 1);
    assert.equal(await s.update<number>("visits", async (n) => n + 10, { default: 100 }), 11);
    await s.put("zero", 0);
    assert.equal(await s.update<number>("zero", (n) => n + 1, { default: 50 }), 1);
    assert.equal(await s.update("none", (v) => (v === undefined ? "was absent" : "no")), "was absent");
    await s.put("ttl", 1, { ttl: 3600 });
    const at = await s.expiresAt("ttl");
    await s.update<number>("ttl", (n) => (n ?? 0) + 1);
    assert.deepEqual(await s.expiresAt("ttl"), at);
    await assert.rejects(s.update("visits", () => { throw new RangeError("no"); }), RangeError);
    assert.equal(await s.get("visits"), 11, "a function that throws writes nothing");
  });

  it("update: many at once from one client lose nothing", async () => {
    const s = db.scope("app", fresh());
    await Promise.all(Array.from({ length: 40 }, () => s.update<number>("n", (n) => n + 1, { default: 0 })));
    assert.equal(await s.get("n"), 40);
  });

  it("append, slice (negatives too), length, pop", async () => {
    const s = db.scope("session", fresh());
    assert.deepEqual(await s.append("l", [1, 2, 3]), { length: 3, version: 1 });
    assert.deepEqual(await s.append("l", [{ x: 4 }]), { length: 4, version: 2 });
    assert.deepEqual(await s.slice("l"), [1, 2, 3, { x: 4 }]);
    assert.deepEqual(await s.slice("l", -2), [3, { x: 4 }]);
    assert.deepEqual(await s.slice("l", 1, -1), [2, 3]);
    assert.deepEqual(await s.slice("absent"), []);
    assert.equal(await s.length("l"), 4);
    assert.equal(await s.length("absent"), 0);
    assert.deepEqual(await s.pop("l"), [{ x: 4 }]);
    assert.deepEqual(await s.pop("l", 5), [1, 2, 3]);
    assert.deepEqual(await s.pop("absent"), []);
    await s.put("scalar", 1);
    await assert.rejects(s.append("scalar", [1]), NotAList);
    await assert.rejects(s.slice("scalar"), NotAList);
    await assert.rejects(s.length("scalar"), NotAList);
    await assert.rejects(s.pop("scalar"), NotAList);
    await assert.rejects(s.append("l", "no" as unknown as unknown[]), InvalidValue);
  });

  it("keys: ascending, literal prefix, after and limit", async () => {
    const s = db.scope("thread", fresh());
    for (const k of ["b", "a_1", "a:1", "ab", "c"]) await s.put(k, 1);
    assert.deepEqual(await s.keys(), ["a:1", "a_1", "ab", "b", "c"]);
    assert.deepEqual(await s.keys({ prefix: "a_" }), ["a_1"]);
    assert.deepEqual(await s.keys({ prefix: "a%" }), []); // "%" is no key character: nothing can start so
    assert.deepEqual(await s.keys({ prefix: "*" }), []);
    assert.deepEqual(await s.keys({ after: "ab", limit: 1 }), ["b"]);
    assert.deepEqual(await s.keys({ limit: 2 }), ["a:1", "a_1"]);
  });

  it("touch, expiresAt and ttl", async () => {
    const s = db.scope("agent", fresh());
    assert.equal(await s.touch("k", 60), false);
    assert.equal(await s.expiresAt("k"), null);
    await s.put("k", 1);
    assert.equal(await s.expiresAt("k"), null);
    const before = Date.now();
    assert.equal(await s.touch("k", 100), true);
    const at = await s.expiresAt("k");
    assert.ok(at instanceof Date && at.getTime() >= before + 99_000 && at.getTime() <= Date.now() + 101_000, String(at));
    assert.equal(await s.touch("k", null), true);
    assert.equal(await s.expiresAt("k"), null);
    await s.put("t", 1, { ttl: 50 });
    assert.ok((await s.expiresAt("t")) instanceof Date);
    await s.put("t", 2, { ttl: "keep" });
    assert.ok((await s.expiresAt("t")) instanceof Date, "ttl: keep keeps the expiry");
    await s.put("t", 3);
    assert.equal(await s.expiresAt("t"), null, "a put without ttl does not expire");
    await assert.rejects(s.put("t", 1, { ttl: 0 }), InvalidValue);
    await assert.rejects(s.touch("t", -1), InvalidValue);
  });

  it("putBytes and getBytes share the key space with JSON values", async () => {
    const s = db.scope("app", fresh());
    const data = new Uint8Array([0, 255, 1, 128, 10]);
    assert.equal(await s.putBytes("b", data), 1);
    assert.deepEqual(await s.getBytes("b"), data);
    assert.equal(await s.getBytes("absent"), null);
    await assert.rejects(s.putBytes("b", data, { ifVersion: 0 }), VersionConflict);
    await s.put("j", { é: [1, 2.5] });
    assert.deepEqual(await s.getBytes("j"), new TextEncoder().encode('{"é":[1,2.5]}'));
    await s.putBytes("jb", new TextEncoder().encode('{"a":[1]}'));
    assert.deepEqual(await s.get("jb"), { a: [1] }, "get parses bytes that are JSON");
    await assert.rejects(s.get("b"), InvalidValue, "bytes that are not JSON");
  });

  it("db.state: the scopes of one invocation; a member not given throws", async () => {
    const inv = { state: db.state({ session: fresh("s"), agent: fresh("a") }) };
    assert.deepEqual(await inv.state.session.append("history", [{ role: "user", content: "hi" }]), { length: 1, version: 1 });
    assert.equal(await inv.state.agent.update<number>("visits", (n) => n + 1, { default: 0 }), 1);
    assert.throws(() => inv.state.user, TypeError);
    assert.throws(() => db.state({ agent: "bad id" }), InvalidKey);
    assert.equal(inv.state.session.kind, "session");
  });

  it("a value is never visible from another scope", async () => {
    const id = fresh();
    await db.scope("agent", id).put("k", "agent's");
    assert.equal(await db.scope("user", id).get("k"), undefined);
    assert.equal(await db.scope("agent", fresh()).get("k"), undefined);
  });

  it("too large is TooLarge with size and limit; bad keys are InvalidKey before anything is sent", async () => {
    const s = db.scope("app", fresh());
    const err = await s.put("big", "x".repeat(1024 * 1024)).catch((e: unknown) => e);
    assert.ok(err instanceof TooLarge, String(err));
    assert.equal(err.limit, 1048576);
    assert.ok(err.size > 1048576);
    // The size and limit Python reports for the same value (SPEC §2: its compact UTF-8 JSON),
    // non-ASCII, a list's items and bytes too, whatever the size (over the server's body limit too).
    const values: [string, () => Promise<unknown>, string][] = [
      ["a string of 5 MiB", () => s.put("big", "x".repeat(5 << 20)), "s.put('big', 'x' * (5 << 20))"],
      ["non-ASCII", () => s.put("big", { t: "é€😀".repeat(150_000) }), "s.put('big', {'t': 'é€😀' * 150_000})"],
      ["append", () => s.append("big", ["é".repeat(300_000), "x".repeat(500_000)]),
        "s.append('big', ['é' * 300_000, 'x' * 500_000])"],
      ["bytes", () => s.putBytes("big", new Uint8Array((1 << 20) + 5)), "s.put_bytes('big', bytes((1 << 20) + 5))"],
    ];
    for (const [what, call, py] of values) {
      const e = await call().catch((x: unknown) => x);
      const want = JSON.parse(await python(
        "import sys, json, agentstate\n" +
        "s = agentstate.open(sys.argv[1]).scope('app', 'sizes')\n" +
        `try:\n    ${py}\nexcept agentstate.TooLarge as e:\n    print(json.dumps([e.size, e.limit]))`, [srv.db])) as number[];
      assert.ok(e instanceof TooLarge, `${what}: ${String(e)}`);
      assert.deepEqual([e.size, e.limit], want, what);
    }
    await assert.rejects(s.get("a/b"), InvalidKey);
    await assert.rejects(s.put("x".repeat(201), 1), InvalidKey);
    await assert.rejects(s.put("", 1), InvalidKey);
    assert.equal(await s.put("x".repeat(200), 1), 1);
  });

  it("values the client lets through are refused by the server with the same class", async () => {
    // What JSON text can carry but the store refuses: the server's answer, through a raw fetch.
    const raw = async (body: string) => {
      const r = await fetch(`${srv.url}/v1/scopes/app/raw/keys/k`, { method: "PUT", body,
        headers: { authorization: `Bearer ${srv.token}`, "content-type": "application/json" } });
      return ((await r.json()) as { error: { code: string } }).error.code;
    };
    let deep = "[]";
    for (let i = 1; i < 513; i++) deep = `[${deep}]`;
    let deepJs: unknown = [];
    for (let i = 1; i < 513; i++) deepJs = [deepJs];
    const s = db.scope("app", "raw");
    for (const [text, value] of [['"a\\u0000"', "a\0"], ['"\\ud800"', "\ud800"], [deep, deepJs],
      ["18446744073709551616", 2n ** 64n]] as [string, unknown][]) {
      const code = await raw(`{"value":${text}}`);
      const err = await s.put("k", value).catch((e: unknown) => e);
      assert.ok(err instanceof AgentStateError);
      assert.equal(err.code, code, text.slice(0, 20));
    }
  });

  it("keys, scope ids and run ids '.' and '..' are reached (the URL escape '~.'), never another", async () => {
    // A fetch URL drops dot segments ('%2E' too): '.../keys/%2E/length' would ask for the key
    // 'length'. The client sends '~.' and '~..', which the server takes as those keys.
    const s = db.scope("agent", fresh());
    await s.put("length", [1, 2, 3]);
    assert.equal(await s.put(".", "dot"), 1);
    assert.equal(await s.put("..", { two: "dots" }), 1);
    assert.equal(await s.get("."), "dot");
    assert.deepEqual(await s.getVersioned(".."), { value: { two: "dots" }, version: 1 });
    await assert.rejects(s.append("..", [1]), NotAList, "the key '..' holds an object");
    await s.put("..", [1]);
    assert.deepEqual(await s.append("..", [2]), { length: 2, version: 3 });
    assert.equal(await s.length(".."), 2);
    await assert.rejects(s.length("."), NotAList, "the key '.' holds a string, not the list at 'length'");
    assert.deepEqual(await s.keys(), [".", "..", "length"]);
    assert.deepEqual(await s.get("length"), [1, 2, 3], "the key 'length' is untouched");
    assert.deepEqual(await s.getBytes("."), new TextEncoder().encode('"dot"'));
    assert.equal(await s.touch(".", 60), true);
    assert.ok((await s.expiresAt(".")) instanceof Date);
    assert.equal(await s.delete("."), true);
    assert.equal(await s.get("."), undefined);
    for (const id of [".", ".."]) {
      const scope = db.scope("thread", id);
      await scope.put(id, id);
      assert.equal(await scope.get(id), id);
      assert.deepEqual(await scope.keys(), [id]);
    }
    assert.equal(await db.scope("thread", "length").get("."), undefined, "scope '.' is its own scope");
    for (const id of [".", ".."]) {
      await db.runs.write(id, [{ seq: 0, type: "user" }], { task: id }, { create: true });
      assert.deepEqual([(await db.runs.head(id))?.id, (await db.runs.read(id))?.snapshot], [id, { task: id }]);
      assert.equal(await db.runs.once(id, ".", () => `ran in ${id}`), `ran in ${id}`);
      assert.equal((await db.runs.claim(id, ".")).status, "done");
      assert.equal(await db.runs.delete(id), true);
    }
  });
});

describe("batch", () => {
  it("applies every write in one request, all or none", async () => {
    const id = fresh();
    const b = db.batch();
    b.scope("agent", id).put("a", 1).put("b", 2, { ifVersion: 0 }).append("l", [1, 2]);
    b.scope("user", id).delete("nothing");
    assert.deepEqual(await b.commit(), [1, 1, { length: 2, version: 1 }, false]);
    assert.equal(await db.scope("agent", id).get("b"), 2);

    const bad = db.batch();
    bad.scope("agent", id).put("c", 3).put("a", 10, { ifVersion: 5 });
    const err = await bad.commit().catch((e: unknown) => e);
    assert.ok(err instanceof VersionConflict);
    assert.equal(err.currentVersion, 1);
    assert.equal(await db.scope("agent", id).get("c"), undefined, "none of a failed batch is written");
    assert.equal(await db.scope("agent", id).get("a"), 1);
    await assert.rejects(bad.commit(), InvalidValue, "a batch commits once");
    assert.deepEqual(await db.batch().commit(), []);
  });

  it("check holds the batch to a key's version and writes nothing", async () => {
    const id = fresh();
    await db.scope("agent", id).put("p", "parent");
    const b = db.batch();
    b.scope("agent", id).check("p", { ifVersion: 1 }).check("none", { ifVersion: 0 }).put("c", 1, { ifVersion: 0 });
    assert.deepEqual(await b.commit(), [1, 0, 1]);
    assert.deepEqual(await db.scope("agent", id).getVersioned("p"), { value: "parent", version: 1 });

    const stale = db.batch();
    stale.scope("agent", id).put("d", 1).check("p", { ifVersion: 0 });
    const err = await stale.commit().catch((e: unknown) => e);
    assert.ok(err instanceof VersionConflict);
    assert.equal(err.currentVersion, 1);
    assert.equal(await db.scope("agent", id).get("d"), undefined, "none of a failed batch is written");
    const s = db.batch().scope("agent", id);
    assert.throws(() => s.check("p", {} as { ifVersion: number }), InvalidValue);
    assert.throws(() => s.check("p", { ifVersion: -1 }), InvalidValue);
    assert.throws(() => s.check("bad key", { ifVersion: 0 }), InvalidKey);
  });
});

describe("runs", () => {
  it("write, read, head, entries, tail, load, list, delete, fork, trim", async () => {
    const id = fresh("run");
    await db.runs.write(id, [{ seq: 0, type: "user", content: "hi" }], { task: "triage" }, { create: true });
    await assert.rejects(db.runs.write(id, [], null, { create: true }), RunExists);
    await db.runs.write(id, [{ seq: 0, type: "user", content: "hi" }, { seq: 1, type: "tool_call", call_id: "c1" }],
      { task: "triage", turn: 1 });
    await assert.rejects(db.runs.write(id, [{ seq: 5 }], null), HistoryGap);
    await assert.rejects(db.runs.write(id, [{ seq: 1, type: "other" }], null), HistoryGap);
    await assert.rejects(db.runs.write(fresh("none"), [], null), RunNotFound);

    const run = await db.runs.read(id);
    assert.ok(run);
    assert.deepEqual(run.entries, [{ seq: 0, type: "user", content: "hi" }, { seq: 1, type: "tool_call", call_id: "c1" }]);
    assert.deepEqual(run.snapshot, { task: "triage", turn: 1 });
    assert.equal(run.firstSeq, 0);
    assert.equal(run.nextSeq, 2);
    assert.equal(await db.runs.read(fresh("none")), null);

    const head = await db.runs.head(id);
    assert.ok(head && head.createdAt instanceof Date && head.updatedAt >= head.createdAt);
    assert.deepEqual([head.id, head.firstSeq, head.nextSeq, head.snapshot], [id, 0, 2, { task: "triage", turn: 1 }]);
    assert.equal(await db.runs.head(fresh("none")), null);

    assert.deepEqual((await db.runs.entries(id, { since: 1 })).map((e) => e.seq), [1]);
    assert.deepEqual((await db.runs.entries(id, { limit: 1 })).map((e) => e.seq), [0]);
    assert.deepEqual((await db.runs.tail(id, 1)).map((e) => e.seq), [1]);

    const loaded = await db.runs.load(id);
    assert.equal(loaded.entries.length, 3);
    assert.deepEqual({ ...loaded.entries[2], content: undefined },
      { type: "tool_result", call_id: "c1", status: "unknown", content: undefined });
    await assert.rejects(db.runs.load(fresh("none")), RunNotFound);

    const listed = await db.runs.list();
    const mine = listed.find((r) => r.id === id);
    assert.ok(mine);
    assert.deepEqual([mine.task, mine.turn, mine.stoppedBy, mine.finished], ["triage", 1, null, false]);
    assert.ok(mine.createdAt instanceof Date);
    assert.equal((await db.runs.list({ limit: 1 })).length, 1);
    assert.deepEqual(await db.runs.list({ limit: 0 }), []);

    const forked = fresh("fork");
    await db.runs.fork(id, forked, { upto: 0 });
    assert.deepEqual((await db.runs.read(forked))?.entries, [{ seq: 0, type: "user", content: "hi" }]);
    await assert.rejects(db.runs.fork(id, forked), RunExists);
    await assert.rejects(db.runs.fork(fresh("none"), fresh("x")), RunNotFound);

    assert.equal(await db.runs.trim(id, { before: 1 }), 1);
    assert.deepEqual((await db.runs.read(id))?.entries.map((e) => e.seq), [1]);
    assert.equal((await db.runs.head(id))?.firstSeq, 1);
    await assert.rejects(db.runs.fork(id, fresh("x"), { upto: 0 }), HistoryGap);

    assert.equal(await db.runs.delete(id), true);
    assert.equal(await db.runs.delete(id), false);
    await assert.rejects(db.runs.write(id, [{ seq: 0, x: 1 }], { bad: NaN }), InvalidValue);
  });

  it("list pages with after", async () => {
    for (let i = 0; i < 3; i++) await db.runs.write(fresh("page"), [], {}, { create: true });
    const all = (await db.runs.list()).map((r) => r.id);
    const first = await db.runs.list({ limit: 2 });
    const next = await db.runs.list({ after: first[1]!.id, limit: 2 });
    assert.deepEqual([...first, ...next].map((r) => r.id), all.slice(0, 4));
  });
});

describe("sessions and turns", () => {
  it("create, get, list, delete, state (the owner's only)", async () => {
    const bob = connect(srv.url, { token: srv.userToken });
    const s = await bob.sessions.create({ metadata: { app: "demo" } });
    assert.equal(s.owner, "bob");
    assert.deepEqual(s.metadata, { app: "demo" });
    assert.ok(s.createdAt instanceof Date);
    assert.deepEqual(await bob.sessions.get(s.id), s);
    assert.ok((await bob.sessions.list()).some((x) => x.id === s.id));
    const st = await bob.sessions.state(s.id);
    await st.append("history", [{ role: "user", content: "hi" }]);
    assert.deepEqual(await db.scope("session", s.id).slice("history"), [{ role: "user", content: "hi" }],
      "the session's state is the scope session:{id}");

    const alice = connect(srv.url, { token: srv.token, principal: "alice" }); // an admin acting for alice
    await assert.rejects(alice.sessions.get(s.id), NotFound, "another's session does not exist");
    await assert.rejects(alice.sessions.state(s.id), NotFound);
    assert.ok(!(await alice.sessions.list()).some((x) => x.id === s.id));
    assert.ok((await db.sessions.list()).some((x) => x.id === s.id), "an admin sees all");
    await assert.rejects(connect(srv.url, { token: srv.userToken, principal: "alice" }).sessions.list(), Forbidden);

    await bob.sessions.delete(s.id);
    await assert.rejects(bob.sessions.get(s.id), NotFound);
    assert.deepEqual(await db.scope("session", s.id).slice("history"), [], "its state went with it");
  });

  it("one turn at a time; the diagram; hold, decide, resume; release", async () => {
    const s = await db.sessions.create();
    const t = await db.sessions.startTurn(s.id, { input: { message: "hi" }, lease: 30 });
    assert.ok(t instanceof Turn);
    assert.deepEqual([t.sessionId, t.status, t.input, t.lease], [s.id, "running", { message: "hi" }, 30]);
    assert.ok(t.leaseUntil instanceof Date && t.createdAt instanceof Date);
    const busy = await db.sessions.startTurn(s.id).catch((e: unknown) => e);
    assert.ok(busy instanceof SessionBusy);
    assert.equal(busy.turnId, t.id);
    await t.heartbeat(45);
    assert.equal(t.lease, 45);
    await t.heartbeat();
    await t.hold({ ask: "approve?" });
    assert.deepEqual([t.status, t.request], ["held", { ask: "approve?" }]);
    await assert.rejects(t.finish(), InvalidTransition);

    const next = await db.sessions.startTurn(s.id, { queued: true }); // held no longer blocks
    assert.equal(next.status, "queued");
    const decided = await db.sessions.decide(t.id, { approved: true });
    assert.deepEqual([decided.status, decided.decision], ["decided", { approved: true }]);
    await next.start(20);
    assert.equal(next.status, "running");
    const resumed = await db.sessions.resume(t.id, { lease: 10 }); // allowed while a newer turn runs
    assert.equal(resumed.status, "resuming");
    await resumed.finish({ done: 1 });
    assert.deepEqual([resumed.status, resumed.result], ["finished", { done: 1 }]);

    const got = await db.sessions.getTurn(t.id);
    assert.deepEqual([got.status, got.result, got.decision], ["finished", { done: 1 }, { approved: true }]);
    assert.deepEqual((await db.sessions.turns(s.id)).map((x) => x.id), [next.id, t.id], "newest first");
    assert.deepEqual((await db.sessions.turns(s.id, { limit: 1 })).map((x) => x.id), [next.id]);
    assert.deepEqual((await db.sessions.turns(s.id, { after: next.id })).map((x) => x.id), [t.id]);
    assert.ok((await db.sessions.turnsByStatus("running")).some((x) => x.id === next.id));
    assert.ok(!(await db.sessions.turnsByStatus(["held", "decided"])).some((x) => x.id === next.id));
    assert.ok((await db.sessions.turnsByStatus()).some((x) => x.id === next.id));

    const bob = connect(srv.url, { token: srv.userToken });
    await assert.rejects(bob.sessions.release(s.id), NotFound, "another's session does not exist");
    await assert.rejects(bob.sessions.release((await bob.sessions.create()).id), Forbidden, "admins only");
    const released = await db.sessions.release(s.id);
    assert.deepEqual([released.id, released.status], [next.id, "failed"]);
    await assert.rejects(next.fail("late"), InvalidTransition);
    assert.equal((await next.refresh()).status, "failed");
    await assert.rejects(db.sessions.getTurn(fresh("no-turn")), NotFound);
  });

  it("turn(id, fn): finished with fn's result, or failed with the error's text and rethrown", async () => {
    const s = await db.sessions.create();
    const value = await db.sessions.turn(s.id, async (turn) => {
      assert.equal(turn.status, "running");
      await (await db.sessions.state(s.id)).append("history", [1]);
      return { answer: 42 };
    }, { input: "q" });
    assert.deepEqual(value, { answer: 42 });
    const [done] = await db.sessions.turns(s.id);
    assert.deepEqual([done!.status, done!.result, done!.input], ["finished", { answer: 42 }, "q"]);

    class ToolError extends Error { override name = "ToolError"; }
    await assert.rejects(db.sessions.turn(s.id, () => { throw new ToolError("boom"); }), ToolError);
    const [failed] = await db.sessions.turns(s.id);
    assert.deepEqual([failed!.status, failed!.error], ["failed", "ToolError: boom"]);

    await db.sessions.turn(s.id, (turn) => turn.hold({ q: 1 }));
    const [held] = await db.sessions.turns(s.id);
    assert.equal(held!.status, "held", "a turn fn moved itself is left as it is");
    assert.equal(await db.sessions.turn(s.id, () => undefined), undefined);
  });

  it("turn(id, fn) whose result cannot be recorded fails the turn with why, and throws the §6 error", async () => {
    const s = await db.sessions.create();
    for (const [what, result, cls] of [["a Date in it", { at: new Date() }, InvalidValue],
      ["over 1 MiB", { text: "x".repeat(1 << 20) }, TooLarge]] as const) {
      // Without the fix the first leaves its turn running: the second is SessionBusy.
      const err = await db.sessions.turn(s.id, () => result).catch((e: unknown) => e);
      assert.ok(err instanceof cls, `${what}: ${String(err)}`);
      const [t] = await db.sessions.turns(s.id);
      assert.deepEqual([t!.status, t!.error], ["failed", `${cls === TooLarge ? "TooLarge" : "InvalidValue"}: ${err.message}`], what);
    }
    const next = await db.sessions.startTurn(s.id);
    assert.equal(next.status, "running", "the session is free at once");
    await next.finish();
  });
});

describe("the feed", () => {
  it("lastChange, changes with filters and camelCase fields", async () => {
    const head = await db.lastChange();
    const id = fresh();
    await db.scope("agent", id).put("a", 1);
    await db.scope("agent", id).append("l", [1, 2]);
    await db.scope("user", id).put("a", 1);
    const all = await db.changes({ since: head });
    assert.ok(all.length >= 3);
    assert.ok(all.every((c, i) => i === 0 || c.seq > all[i - 1]!.seq));
    const mine = await db.changes({ since: head, kind: "agent", scopeId: id });
    assert.deepEqual(mine.map((c) => [c.topic, c.op, c.kind, c.scopeId, c.key, c.version, c.start, c.count]),
      [["kv", "put", "agent", id, "a", 1, null, null], ["kv", "append", "agent", id, "l", 1, 0, 2]]);
    assert.ok(mine[0]!.at instanceof Date);
    assert.deepEqual((await db.changes({ since: head, kind: "agent", scopeId: id, key: "l" })).length, 1);
    assert.deepEqual((await db.changes({ since: head, limit: 1 })).length, 1);
    assert.equal(await db.lastChange(), all[all.length - 1]!.seq);
  });

  it("watch waits for a matching change, gives [] after its timeout, and moves past others", async () => {
    const id = fresh();
    const head = await db.lastChange();
    assert.deepEqual(await db.watch(head, { timeout: 0.2, scopeId: id }), []);
    const waiting = db.watch(head, { timeout: 60, kind: "app", scopeId: id });
    await db.scope("user", id).put("other", 1); // not this watch's
    await db.scope("app", id).put("k", 1);
    const got = await waiting;
    assert.deepEqual(got.map((c: Change) => [c.kind, c.scopeId, c.key]), [["app", id, "k"]]);
  });

  it("subscribe delivers each change once, in order, and ends when its signal aborts", async () => {
    const id = fresh();
    const since = await db.lastChange();
    const ac = new AbortController();
    const seen: Change[] = [];
    const done = (async () => {
      for await (const ch of db.subscribe(since, { kind: "agent", scopeId: id, signal: ac.signal })) {
        seen.push(ch);
        if (seen.length === 5) ac.abort();
      }
    })();
    for (let i = 0; i < 5; i++) await db.scope("agent", id).put(`k${i}`, i);
    await done;
    assert.deepEqual(seen.map((c) => c.key), ["k0", "k1", "k2", "k3", "k4"]);
  });

  it("a pending watch and a subscribe end promptly when aborted", async () => {
    const head = await db.lastChange();
    const ac = new AbortController();
    const t0 = Date.now();
    const w = db.watch(head, { timeout: 120, scopeId: fresh("quiet"), signal: ac.signal });
    const sub = (async () => {
      for await (const _ of db.subscribe(head, { scopeId: fresh("quiet"), signal: ac.signal })) { /* none */ }
    })();
    setTimeout(() => ac.abort(), 300);
    await assert.rejects(w, (e: Error) => e.name === "AbortError");
    await sub;
    assert.ok(Date.now() - t0 < 20_000, "ended long before the watch's 120 s");
  });

  it("a bad cursor or filter is refused", async () => {
    await assert.rejects(db.changes({ since: -1 }), InvalidValue);
    await assert.rejects(db.changes({ kind: "nope" as "app" }), InvalidKey);
  });
});

describe("a URL that reaches no route", () => {
  it("is a StorageError (the server's unknown_route), never an absent key, run or session", async () => {
    const wrong = connect(`${srv.url}/state`, { token: srv.token }); // a proxy's prefix, not stripped
    for (const [what, call] of [["get", () => wrong.scope("app", "x").get("k")],
      ["getVersioned", () => wrong.scope("app", "x").getVersioned("k")], ["runs.read", () => wrong.runs.read("r")],
      ["sessions.get", () => wrong.sessions.get("s")], ["put", () => wrong.scope("app", "x").put("k", 1)]] as const) {
      const e = await call().then(() => null, (x: unknown) => x);
      assert.ok(e instanceof StorageError && !(e instanceof NotFound), `${what}: ${String(e)}`);
      assert.equal(e.outcomeUnknown, false, what);
    }
  });
});

describe("auth", () => {
  it("an unknown token is Unauthorized, for every kind of call", async () => {
    const bad = connect(srv.url, { token: "not-a-token" });
    await assert.rejects(bad.scope("app", "x").get("k"), Unauthorized);
    await assert.rejects(bad.runs.list(), Unauthorized);
    await assert.rejects(bad.lastChange(), Unauthorized);
    await assert.rejects(async () => { for await (const _ of bad.subscribe(0)) { /* none */ } }, Unauthorized);
  });
});

describe("settings, check and info", () => {
  it("settings with their defaults; setSetting for every process; check and info for admins", async () => {
    const before = await db.settings();
    assert.equal(typeof before.feed_retention, "number");
    await db.setSetting("feed_retention", 86400);
    assert.deepEqual(await db.settings(), { ...before, feed_retention: 86400 });
    assert.equal(await connect(srv.url, { token: srv.userToken }).settings().then((s) => s.feed_retention), 86400);
    await assert.rejects(db.setSetting("no_such_setting", 1), InvalidValue);
    await assert.rejects(db.setSetting("feed_retention", 1.5), InvalidValue);
    await assert.rejects(db.setSetting("feed_retention", -1), InvalidValue);
    await db.setSetting("feed_retention", before.feed_retention!);
    assert.deepEqual(await db.settings(), before);

    assert.deepEqual(await db.check(), []);
    const info = await db.info();
    assert.equal(typeof info, "object");
    assert.ok(Object.keys(info).length > 0, JSON.stringify(info));
    const user = connect(srv.url, { token: srv.userToken });
    await assert.rejects(user.setSetting("feed_retention", 1), Forbidden);
    await assert.rejects(user.check(), Forbidden);
    await assert.rejects(user.info(), Forbidden);
  });
});

describe("the types against the server's /openapi.json", () => {
  async function doc(): Promise<Doc> {
    return (await (await fetch(`${srv.url}/openapi.json`)).json()) as Doc;
  }

  it("every route the client calls exists with the fields its types declare; every other route is listed", async () => {
    assert.deepEqual(disagreements(await doc()), []);
  });

  it("the comparison fails when the server adds a field or a route, or drops one", async () => {
    const d = await doc();
    const turn = d.paths["/v1/turns/{turn_id}"]!.get!.responses["200"]!.content!["application/json"]!.schema;
    const copy = structuredClone(d);
    (copy.paths["/v1/turns/{turn_id}"]!.get!.responses["200"]!.content!["application/json"]!.schema.properties as
      Record<string, unknown>).fence = { type: "string" };
    assert.match(disagreements(copy).join("\n"), /\/v1\/turns\/\{turn_id\}\.fence: sent by the server, unknown/);
    const dropped = structuredClone(d);
    delete (dropped.paths["/v1/changes"]!.get!.responses["200"]!.content!["application/json"]!.schema.properties!
      .changes!.items!.properties as Record<string, unknown>).scope_id;
    assert.match(disagreements(dropped).join("\n"), /changes\[\]\.scope_id: in the client's types, not sent/);
    const added = structuredClone(d);
    added.paths["/v1/runs/{run_id}/export"] = { post: { responses: {} } };
    assert.match(disagreements(added).join("\n"), /POST \/v1\/runs\/\{run_id\}\/export: a route of the server/);
    const claim = (x: Doc) => x.paths["/v1/runs/{run_id}/calls/{call_id}/claim"]!.post!;
    const optional = structuredClone(d);
    const claimAnswer = claim(optional).responses["200"]!.content!["application/json"]!.schema;
    claimAnswer.required = ["status"]; // the entry no longer always sent
    assert.match(disagreements(optional).join("\n"), /claim\.entry: the server may leave it out/);
    claimAnswer.required = ["status", "entry", "error"];
    assert.match(disagreements(optional).join("\n"), /claim\.error: always sent by the server, optional/);
    const unfenced = structuredClone(d);
    claim(unfenced).parameters = claim(unfenced).parameters!.filter((p) => p.name !== "X-Agentstate-Fence");
    assert.match(disagreements(unfenced).join("\n"), /claim: the client fences it, the server takes no X-Agentstate-Fence/);
    const map = structuredClone(d);
    const many = map.paths["/v1/scopes/{kind}/{id}/get_many"]!.post!.responses["200"]!.content!["application/json"]!.schema;
    (many.properties!.values!.additionalProperties as { properties: Record<string, unknown> }).properties.version = { type: "string" };
    assert.match(disagreements(map).join("\n"), /get_many\.values\{\}\.version: the client reads integer, the server sends string/);
    const gone = structuredClone(d);
    delete gone.paths["/v1/runs/{run_id}/head"];
    assert.match(disagreements(gone).join("\n"), /GET \/v1\/runs\/\{run_id\}\/head: called by the client, not in/);
    assert.ok(turn);
  });

  it("a change in the event stream has the fields of a change in /v1/changes", async () => {
    const since = await db.lastChange();
    await db.scope("app", fresh()).put("k", 1);
    const ac = new AbortController();
    const r = await fetch(`${srv.url}/v1/changes/stream?since=${since}`, {
      headers: { authorization: `Bearer ${srv.token}` }, signal: ac.signal });
    const reader = r.body!.getReader();
    let text = "";
    while (!text.includes("\ndata: ")) text += new TextDecoder().decode((await reader.read()).value);
    while (!/\ndata: .*\n/.test(text)) text += new TextDecoder().decode((await reader.read()).value);
    ac.abort();
    const data = JSON.parse(/\ndata: (.*)\n/.exec(text)![1]!) as Record<string, unknown>;
    const fields = Object.keys(d(await doc()));
    assert.deepEqual(Object.keys(data).sort(), fields.sort());
    function d(x: Doc) {
      return x.paths["/v1/changes"]!.get!.responses["200"]!.content!["application/json"]!.schema.properties!.changes!
        .items!.properties!;
    }
  });
});

describe("a cursor the feed no longer keeps", () => {
  it("changes, watch and subscribe throw CursorExpired", async () => {
    const retention = (value: number) => fetch(`${srv.url}/v1/settings/feed_retention`, {
      method: "PUT", body: JSON.stringify({ value }),
      headers: { authorization: `Bearer ${srv.token}`, "content-type": "application/json" } }).then((r) => r.json());
    await db.scope("app", fresh()).put("k", 1); // the feed is not empty
    assert.equal(((await retention(0)) as { feed_retention: number }).feed_retention, 0); // the feed off: only the head is a cursor
    try {
      await assert.rejects(db.changes({ since: 0 }), CursorExpired);
      await assert.rejects(db.watch(0, { timeout: 5 }), CursorExpired);
      await assert.rejects(async () => { for await (const _ of db.subscribe(0)) { /* none */ } }, CursorExpired);
      assert.deepEqual(await db.changes({ since: await db.lastChange() }), []);
    } finally {
      await retention(604800);
    }
  });
});
