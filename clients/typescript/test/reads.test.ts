/**
 * SPEC §12's reads in one call against a real `agentstate serve`: `getMany`, `items` and
 * `clear` on a scope and on a session's own state; `runs.pin` and `pinned`;
 * `runs.entries(id, { raw: true })`, the stored text of each entry; `runs.prune` (which
 * skips a pinned run) and `sessions.prune`, for admins.
 */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { Forbidden, InvalidKey, InvalidValue, RunNotFound, connect, type Database, type JsonObject } from "agentstate-db";
import { fresh, served, type Served } from "./server.js";

let srv: Served;
let db: Database;
served((s, d) => {
  [srv, db] = [s, d];
});

/** A client whose requests are counted. */
function counting(): { db: Database; requests: string[] } {
  const requests: string[] = [];
  const f = async (url: string, init?: RequestInit) => {
    requests.push(`${init?.method ?? "GET"} ${new URL(url).pathname}`);
    return fetch(url, init);
  };
  return { db: connect(srv.url, { token: srv.token, fetch: f }), requests };
}

describe("getMany", () => {
  it("several keys in one request, in the order asked, absent ones as getVersioned gives them", async () => {
    const { db: c, requests } = counting();
    const s = c.scope("agent", fresh());
    await s.put("a", { x: [1, 2] });
    await s.put("b", 2n ** 60n);
    await s.put("b", "b2");
    await s.append("l", [1, null]);
    await s.put("__proto__", "a key like any other");
    requests.length = 0;
    const got = await s.getMany(["l", "missing", "a", "b", "a", "__proto__", "constructor"]);
    assert.deepEqual(requests, [`POST /v1/scopes/agent/${s.id}/get_many`]);
    assert.deepEqual(Object.keys(got), ["l", "missing", "a", "b", "__proto__", "constructor"]);
    assert.deepEqual(got.l, { value: [1, null], version: 1 });
    assert.deepEqual(got.missing, { value: undefined, version: 0 });
    assert.deepEqual(got.a, { value: { x: [1, 2] }, version: 1 });
    assert.deepEqual(got.b, { value: "b2", version: 2 });
    assert.ok(Object.hasOwn(got, "__proto__") && Object.getPrototypeOf(got) === Object.prototype);
    assert.deepEqual(got["__proto__"], { value: "a key like any other", version: 1 });
    assert.deepEqual(got.constructor, { value: undefined, version: 0 });
    for (const k of ["l", "missing", "a", "b"]) assert.deepEqual(got[k], await s.getVersioned(k), k);
    requests.length = 0;
    assert.deepEqual(await s.getMany([]), {});
    assert.deepEqual(requests, [], "no keys: no request");
  });

  it("big integers stay exact; bad keys and too many are refused before anything is sent", async () => {
    const s = db.scope("user", fresh());
    await s.put("big", [2n ** 63n - 1n, 9007199254740993n, 1.5]);
    assert.deepEqual((await s.getMany(["big"])).big, { value: [2n ** 63n - 1n, 9007199254740993n, 1.5], version: 1 });
    await assert.rejects(s.getMany(["ok", "a/b"]), InvalidKey);
    await assert.rejects(s.getMany("big" as unknown as string[]), InvalidValue);
    await assert.rejects(s.getMany(Array.from({ length: 1001 }, (_, i) => `k${i}`)), InvalidValue);
    const many = await s.getMany(Array.from({ length: 1000 }, (_, i) => `k${i}`));
    assert.equal(Object.keys(many).length, 1000);
  });
});

describe("items and clear", () => {
  it("items: keys with values and versions, ascending, with the paging of keys()", async () => {
    const { db: c, requests } = counting();
    const s = c.scope("thread", fresh());
    for (const k of ["b", "a_1", "a:1", "ab", "c"]) await s.put(k, k.toUpperCase());
    await s.put("c", "C2");
    requests.length = 0;
    const all = await s.items();
    assert.equal(requests.length, 1);
    assert.deepEqual(all, [["a:1", { value: "A:1", version: 1 }], ["a_1", { value: "A_1", version: 1 }],
      ["ab", { value: "AB", version: 1 }], ["b", { value: "B", version: 1 }], ["c", { value: "C2", version: 2 }]]);
    assert.deepEqual(all.map(([k]) => k), await s.keys());
    assert.deepEqual(await s.items({ prefix: "a_" }), [["a_1", { value: "A_1", version: 1 }]]);
    assert.deepEqual(await s.items({ prefix: "%" }), []);
    assert.deepEqual((await s.items({ after: "ab", limit: 2 })).map(([k]) => k), ["b", "c"]);
    requests.length = 0;
    assert.deepEqual(await s.items({ limit: 0 }), []);
    assert.deepEqual(requests, []);
    assert.deepEqual(await db.scope("thread", fresh()).items(), []);
  });

  it("clear: every key of the scope at once, how many; other scopes untouched; versions not reused", async () => {
    const id = fresh();
    const s = db.scope("app", id);
    for (const k of ["a", "b", "c"]) await s.put(k, 1);
    await s.put("a", 2);
    await db.scope("user", id).put("a", "other scope");
    const since = await db.lastChange();
    assert.equal(await s.clear(), 3);
    assert.deepEqual(await s.keys(), []);
    assert.equal(await s.clear(), 0);
    assert.equal(await db.scope("user", id).get("a"), "other scope");
    assert.deepEqual((await db.changes({ since, kind: "app", scopeId: id })).map((ch) => [ch.op, ch.key]).sort(),
      [["delete", "a"], ["delete", "b"], ["delete", "c"]], "a delete change per key");
    assert.ok((await s.put("a", 3)) > 2, "versions are never reused after a clear");
  });

  it("a session's own state: getMany, items and clear after the access check", async () => {
    const bob = connect(srv.url, { token: srv.userToken });
    const session = await bob.sessions.create();
    const st = await bob.sessions.state(session.id);
    await st.put("x", 1);
    await st.append("history", [{ role: "user" }]);
    const { db: c, requests } = counting();
    const admins = await c.sessions.state(session.id);
    requests.length = 0;
    assert.deepEqual(await admins.getMany(["x", "y"]), { x: { value: 1, version: 1 }, y: { value: undefined, version: 0 } });
    assert.deepEqual((await admins.items()).map(([k]) => k), ["history", "x"]);
    assert.deepEqual(requests, [`POST /v1/sessions/${session.id}/state/get_many`,
      `GET /v1/sessions/${session.id}/state/items`]);
    assert.deepEqual(await st.getMany(["x"]), await db.scope("session", session.id).getMany(["x"]));
    assert.equal(await st.clear(), 2);
    assert.deepEqual(await db.scope("session", session.id).keys(), []);
  });
});

describe("runs: pin, pinned, raw entries", () => {
  it("pin and unpin; head and list carry pinned; a missing run is RunNotFound", async () => {
    const id = fresh("run");
    await db.runs.write(id, [], { task: "keep" }, { create: true });
    assert.equal((await db.runs.head(id))?.pinned, false);
    assert.equal(await db.runs.pin(id), true);
    assert.equal((await db.runs.head(id))?.pinned, true);
    assert.equal((await db.runs.list()).find((r) => r.id === id)?.pinned, true);
    assert.equal(await db.runs.pin(id, false), false);
    assert.equal((await db.runs.list()).find((r) => r.id === id)?.pinned, false);
    await assert.rejects(db.runs.pin(fresh("none")), RunNotFound);
    await assert.rejects(db.runs.pin(id, "yes" as unknown as boolean), InvalidValue);
  });

  it("raw: each entry's stored text, cut from the answer, never decoded", async () => {
    const id = fresh("run");
    const entries: JsonObject[] = [
      { seq: 0, type: "user", content: "a \"quoted\", [bracketed] {braced} text, with \\ and , and ]}" },
      { seq: 1, type: "tool_call", call_id: "c", args: { nested: [[], {}, [{ a: "]" }]], n: 2n ** 62n } },
      { seq: 2, type: "assistant", content: "é ü 漢字 😀 \u2028", f: 1e-7, empty: "" },
    ];
    await db.runs.write(id, entries, null, { create: true });
    const raw = await db.runs.entries(id, { raw: true });
    assert.ok(raw.every((t) => typeof t === "string"));
    assert.deepEqual(raw.map((t) => JSON.parse(t.replace(/4611686018427387904/, "0"))),
      (await db.runs.entries(id)).map((e) => ({ ...e, ...(e.args ? { args: { ...(e.args as JsonObject), n: 0 } } : {}) })));
    assert.equal(raw[2], '{"seq":2,"type":"assistant","content":"é ü 漢字 😀 \u2028","f":1e-07,"empty":""}');
    assert.deepEqual(await db.runs.entries(id, { since: 1, limit: 1, raw: true }), [raw[1]]);
    assert.deepEqual(await db.runs.entries(id, { since: 3, raw: true }), []);
    assert.deepEqual(await db.runs.entries(fresh("none"), { raw: true }), [], "[] for an unknown run, as without raw");
  });
});

describe("prune (admins)", () => {
  it("runs.prune deletes the old finished runs and never a pinned one; sessions.prune the idle sessions", async () => {
    const [done, pinned, open] = [fresh("run"), fresh("run"), fresh("run")];
    for (const id of [done, pinned, open]) {
      await db.runs.write(id, [], { task: "t", finished: id !== open }, { create: true });
    }
    await db.runs.pin(pinned);
    const pruned = await db.runs.prune({ olderThan: 0 });
    assert.ok(pruned.includes(done) && !pruned.includes(pinned) && !pruned.includes(open), pruned.join(" "));
    assert.deepEqual([await db.runs.head(done), (await db.runs.head(pinned))?.pinned], [null, true]);
    assert.ok((await db.runs.prune({ olderThan: 0, finishedOnly: false })).includes(open));
    assert.equal((await db.runs.head(pinned))?.pinned, true, "pinned: kept whatever finishedOnly says");
    assert.deepEqual(await db.runs.prune({ olderThan: 3600 }), []);

    const idle = await db.sessions.create();
    const busy = await db.sessions.create();
    await db.sessions.startTurn(busy.id);
    const gone = await db.sessions.prune({ idleFor: 0 });
    assert.ok(gone.includes(idle.id) && !gone.includes(busy.id), gone.join(" "));
    assert.equal((await db.sessions.list()).some((s) => s.id === idle.id), false);

    const user = connect(srv.url, { token: srv.userToken });
    await assert.rejects(user.runs.prune({ olderThan: 0 }), Forbidden);
    await assert.rejects(user.sessions.prune({ idleFor: 0 }), Forbidden);
    await assert.rejects(db.runs.prune({ olderThan: -1 }), InvalidValue);
    await assert.rejects(db.runs.prune({ olderThan: 0, finishedOnly: "no" as unknown as boolean }), InvalidValue);
    await assert.rejects(db.sessions.prune({ idleFor: Number.NaN }), InvalidValue);
    assert.equal((await db.runs.head(pinned))?.pinned, true);
  });
});
