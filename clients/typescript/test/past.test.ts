/**
 * SPEC §17 through the TypeScript client, against a real `agentstate serve`: `db.asOf(seq)`
 * (its scopes read the past, their writes throw UsageError before anything is sent),
 * `scope.history`, `db.diff`, `scope.restore` (fenced), `sessions.fork`; another
 * principal's session's past is as absent as its present.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  CursorExpired, InvalidValue, LeaseLost, NotFound, UsageError, connect, type Database, type Revision,
} from "agentstate-db";
import { fresh, served, type Served } from "./server.js";

let srv: Served;
let db: Database;
served((s, d) => {
  [srv, db] = [s, d];
});

describe("db.asOf", () => {
  it("reads a scope as it was right after a change; its writes throw UsageError and send nothing", async () => {
    const requests: string[] = [];
    const c = connect(srv.url, { token: srv.token, fetch: async (url: string, init?: RequestInit) => {
      requests.push(`${init?.method ?? "GET"} ${new URL(url).pathname}`);
      return fetch(url, init);
    } });
    const id = fresh("u");
    const s = c.scope("user", id);
    await s.put("settings", { theme: "dark" }, { ttl: 3600 });
    await s.append("log", [1, 2, 3]);
    await s.putBytes("raw", new Uint8Array([0xff, 0x00]));
    const then = await c.lastChange();
    await s.put("settings", { theme: "light" });
    await s.append("log", [4]);
    await s.put("later", 1);
    await s.delete("raw");
    const past = c.asOf(then);
    const p = past.scope("user", id);
    assert.equal(p.asOf, then);
    assert.deepEqual(await p.get("settings"), { theme: "dark" });
    assert.deepEqual(await p.getVersioned("later"), { value: undefined, version: 0 });
    assert.equal(await p.get("later", "absent"), "absent");
    assert.deepEqual(await p.slice("log", 1), [2, 3]);
    assert.equal(await p.length("log"), 3);
    assert.deepEqual(await p.keys(), ["log", "raw", "settings"]);
    assert.deepEqual(await p.items({ prefix: "s" }), [["settings", { value: { theme: "dark" }, version: 1 }]]);
    assert.deepEqual(await p.getMany(["settings", "later"]), {
      settings: { value: { theme: "dark" }, version: 1 }, later: { value: undefined, version: 0 } });
    assert.ok((await p.expiresAt("settings")) instanceof Date);
    assert.deepEqual(await p.getBytes("raw"), new Uint8Array([0xff, 0x00]));
    assert.deepEqual(await past.state({ user: id }).user.get("settings"), { theme: "dark" });
    assert.equal(await s.getBytes("raw"), null);
    assert.equal(await s.expiresAt("settings"), null);
    requests.length = 0;
    for (const write of [() => p.put("k", 1), () => p.delete("settings"), () => p.append("log", [9]),
      () => p.pop("log"), () => p.clear(), () => p.touch("settings", 1), () => p.update("k", () => 1),
      () => p.putBytes("raw", new Uint8Array([1])), () => p.restore(then), () => p.history("settings")]) {
      await assert.rejects(write(), UsageError);
    }
    assert.deepEqual(requests, []);
  });

  it("a seq past the newest change is InvalidValue, one no seq at all before anything is sent", async () => {
    const s = db.scope("app", fresh());
    await s.put("k", 1);
    const head = await db.lastChange();
    await assert.rejects(db.asOf(head + 1000).scope("app", s.id).get("k"), InvalidValue);
    for (const bad of [-1, 1.5, Number.NaN, "3"]) assert.throws(() => db.asOf(bad as number), InvalidValue);
    assert.equal(await db.asOf(head).scope("app", s.id).get("k"), 1);
  });
});

describe("history, diff, restore and fork", () => {
  it("history: a key's revisions newest first, with Dates, bytes as Uint8Array, paged", async () => {
    const s = db.scope("agent", fresh());
    for (let i = 0; i < 5; i++) await s.put("k", { i });
    await s.delete("k");
    await s.putBytes("k", new Uint8Array([7]));
    const revs: Revision[] = await s.history("k");
    assert.deepEqual(revs.map((r) => [r.op, r.value]), [
      ["put", new Uint8Array([7])], ["delete", undefined], ...[4, 3, 2, 1, 0].map((i) => ["put", { i }])]);
    assert.ok(revs.every((r) => r.at instanceof Date && !Number.isNaN(r.at.getTime())));
    assert.deepEqual(revs.map((r) => r.seq), [...revs.map((r) => r.seq)].sort((a, b) => b - a));
    assert.deepEqual(await s.history("k", { limit: 2 }), revs.slice(0, 2));
    assert.deepEqual(await s.history("k", { before: revs[2]!.seq, limit: 2 }), revs.slice(3, 5));
    assert.deepEqual(await s.history("k", { since: revs[3]!.seq }), revs.slice(0, 3));
    assert.deepEqual(await s.history("never"), []);
    await assert.rejects(s.history("k", { limit: -1 }), InvalidValue);
  });

  it("diff follows the server's pages (1,000 keys each): every key once, in order", async () => {
    const id = fresh();
    const since = await db.lastChange();
    const keys = Array.from({ length: 1001 }, (_, i) => `k${String(i).padStart(4, "0")}`);
    for (const part of [keys.slice(0, 500), keys.slice(500)]) { // (a batch holds 1,000 ops at most)
      const b = db.batch();
      for (const k of part) b.scope("thread", id).put(k, k);
      await b.commit();
    }
    const got = await db.diff(since, { kind: "thread", scopeId: id });
    assert.deepEqual(got.map((d) => d.key), keys);
    assert.equal(got[1000].after.value, "k1000");
  });

  it("diff: every key changed between two changes, filtered, before and after", async () => {
    const a = db.scope("user", fresh());
    await a.put("x", 1);
    const since = await db.lastChange();
    await a.put("x", 2);
    await a.append("l", ["new"]);
    const until = await db.lastChange();
    await a.put("x", 3);
    const got = await db.diff(since, { until, kind: "user", scopeId: a.id });
    assert.deepEqual(got, [
      { kind: "user", scopeId: a.id, key: "l", before: { value: undefined, version: 0 },
        after: { value: ["new"], version: 1 } },
      { kind: "user", scopeId: a.id, key: "x", before: { value: 1, version: 1 }, after: { value: 2, version: 2 } }]);
    assert.deepEqual((await db.diff(since, { scopeId: a.id, key: "x" })).map((d) => d.after.value), [3]);
    await assert.rejects(db.diff(until, { until: since }), InvalidValue);
    await assert.rejects(db.diff(0, { kind: "nope" as "user" }), Error);
  });

  it("restore: the scope back as new versions; fenced by a lapsed turn it writes nothing", async () => {
    const s = db.scope("app", fresh());
    await s.put("x", { a: 1 });
    await s.append("l", [1, 2]);
    const then = await db.lastChange();
    await s.put("x", { a: 2 });
    await s.append("l", [3]);
    await s.put("made", 1);
    assert.equal(await s.restore(then, { keys: ["x"] }), 1);
    assert.deepEqual([await s.getVersioned("x"), await s.get("l")], [{ value: { a: 1 }, version: 3 }, [1, 2, 3]]);
    const session = await db.sessions.create();
    const turn = await db.sessions.startTurn(session.id, { lease: 0.05 });
    await new Promise((r) => setTimeout(r, 200));
    const head = await db.lastChange();
    await assert.rejects(s.restore(then, { fence: turn }), LeaseLost);
    assert.equal(await db.lastChange(), head);
    assert.equal(await s.restore(then), 2);
    assert.deepEqual(await s.keys(), ["l", "x"]);
    assert.deepEqual(await s.get("l"), [1, 2]);
    await assert.rejects(s.restore(head + 1000), InvalidValue);
    await assert.rejects(s.restore(then, { keys: ["bad key"] }), Error);
  });

  it("fork: a new session of the caller with the state then, independent after", async () => {
    const orig = await db.sessions.create({ metadata: { who: "a" } });
    const st = await db.sessions.state(orig.id);
    await st.append("history", [1, 2]);
    const then = await db.lastChange();
    await st.append("history", [3]);
    const f = await db.sessions.fork(orig.id, { at: then });
    assert.notEqual(f.id, orig.id);
    assert.deepEqual([f.owner, f.metadata], [orig.owner, { who: "a" }]);
    const fst = await db.sessions.state(f.id);
    assert.deepEqual(await fst.get("history"), [1, 2]);
    assert.deepEqual(await db.sessions.turns(f.id), []);
    await fst.append("history", [9]);
    assert.deepEqual(await st.get("history"), [1, 2, 3]);
    const now = await db.sessions.fork(orig.id, { metadata: { who: "b" } });
    assert.deepEqual(now.metadata, { who: "b" });
    assert.deepEqual(await (await db.sessions.state(now.id)).get("history"), [1, 2, 3]);
    await assert.rejects(db.sessions.fork(orig.id, { at: (await db.lastChange()) + 1000 }), InvalidValue);
    await assert.rejects(db.sessions.fork(orig.id, { metadata: [] as unknown as Record<string, never> }), InvalidValue);
  });

  it("another principal's session's past is as absent as its present", async () => {
    const bob = connect(srv.url, { token: srv.userToken });
    const mine = await db.sessions.create();
    const st = await db.sessions.state(mine.id);
    await st.put("secret", 1);
    const then = await db.lastChange();
    await st.put("secret", 2);
    assert.equal(await bob.asOf(then).scope("session", mine.id).get("secret"), undefined);
    await assert.rejects(bob.scope("session", mine.id).history("secret"), NotFound);
    await assert.rejects(bob.scope("session", mine.id).restore(then), NotFound);
    await assert.rejects(bob.sessions.fork(mine.id), NotFound);
    assert.ok(!(await bob.diff(then)).some((d) => d.scopeId === mine.id));
    assert.ok((await db.diff(then)).some((d) => d.scopeId === mine.id));
  });

  it("history off: a past read older than the head is CursorExpired", async () => {
    const s = db.scope("app", fresh());
    await s.put("k", 1);
    await s.put("k", 2);
    const head = await db.lastChange();
    const before = (await db.settings()).history_retention;
    assert.equal(before, 86400);
    await db.setSetting("history_retention", 0);
    try {
      await assert.rejects(db.asOf(head - 1).scope("app", s.id).get("k"), CursorExpired);
    } finally {
      await db.setSetting("history_retention", before);
    }
  });
});
