/**
 * SPEC §14 against a real `agentstate serve`: fenced writes (every write of a scope, a
 * fenced scope or state, a batch, runs.write) and tool calls that run at most once
 * (`runs.claim`, `runs.settle`, `runs.once`).
 */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  CallFailed, CallInProgress, InDoubt, InvalidTransition, InvalidValue, LeaseLost, NOT_RUN, RunNotFound, TooLarge,
  UsageError, connect,
  type Database, type Fence, type JsonObject, type Scope, type Turn,
} from "agentstate-db";
import { fresh, served, type Served } from "./server.js";

let srv: Served;
let db: Database;
served((s, d) => {
  [srv, db] = [s, d];
});

/** A running turn (its lease: a minute) of a new session. */
async function liveTurn(lease = 60): Promise<Turn> {
  return db.sessions.startTurn((await db.sessions.create()).id, { lease });
}

/** A turn that no longer holds a lease: finished. */
async function deadTurn(): Promise<Turn> {
  return (await liveTurn()).finish("done");
}

/** What a write could change in a scope: its keys with their values and versions, and one expiry. */
async function contents(s: Scope): Promise<unknown> {
  return [await s.items(), await s.expiresAt("k")];
}

async function run(): Promise<string> {
  const id = fresh("run");
  await db.runs.write(id, [], { task: "calls" }, { create: true });
  return id;
}

const WRITES: [string, (s: Scope, o: { fence?: Fence }) => Promise<unknown>][] = [
  ["put", (s, o) => s.put("k", 2, o)],
  ["putBytes", (s, o) => s.putBytes("b", new TextEncoder().encode("2"), o)],
  ["delete", (s, o) => s.delete("k", o)],
  ["append", (s, o) => s.append("l", [2], o)],
  ["pop", (s, o) => s.pop("l", 1, o)],
  ["update", (s, o) => s.update<number>("k", (v) => (v ?? 0) + 1, o)],
  ["touch", (s, o) => s.touch("k", 600, o)],
  ["clear", (s, o) => s.clear(o)],
];

describe("fenced writes", () => {
  for (const [name, write] of WRITES) {
    it(`${name}: lands while the fence's turn holds its lease, else LeaseLost and nothing written`, async () => {
      const [dead, live] = await Promise.all([deadTurn(), liveTurn()]);
      const id = fresh(name);
      const s = db.scope("agent", id);
      await s.put("k", 1);
      await s.append("l", [1]);
      await s.putBytes("b", new TextEncoder().encode("1"));
      const before = await contents(s);
      const fencedScope = db.scope("agent", id, { fence: dead });
      const fencedState = db.state({ agent: id, fence: dead.id }).agent;
      for (const [how, attempt] of [
        ["the write's fence", () => write(s, { fence: dead })],
        ["a turn id", () => write(s, { fence: dead.id })],
        ["a fenced scope", () => write(fencedScope, {})],
        ["db.state's fence", () => write(fencedState, {})],
      ] as [string, () => Promise<unknown>][]) {
        const err = await attempt().then(() => null, (e: unknown) => e);
        assert.ok(err instanceof LeaseLost, `${how}: ${String(err)}`);
        assert.equal(err.turnId, dead.id, how);
        assert.deepEqual(await contents(s), before, `${how}: nothing written`);
      }
      await write(fencedScope, { fence: live }); // the write's own fence, not the scope's
      assert.notDeepEqual(await contents(s), before, "written under the live fence");
    });
  }

  it("a turn whose lease lapsed fences nothing; nor does an unknown turn", async () => {
    const t = await liveTurn();
    const s = db.scope("user", fresh(), { fence: t });
    assert.equal(await s.put("k", 1), 1, "written while the lease holds");
    await t.heartbeat(0.2); // a short lease from now on, then wait past it
    while (Date.now() < t.leaseUntil!.getTime() + 100) await new Promise((r) => setTimeout(r, 100));
    const err = await s.put("k", 2).catch((e: unknown) => e);
    assert.ok(err instanceof LeaseLost && err.turnId === t.id, String(err));
    const unknown = await s.put("k", 3, { fence: "t-no-such-turn" }).catch((e: unknown) => e);
    assert.ok(unknown instanceof LeaseLost && unknown.turnId === "t-no-such-turn", String(unknown));
    assert.deepEqual(await s.getVersioned("k"), { value: 1, version: 1 });
  });

  it("a batch with a fence applies all or none; runs.write takes a fence", async () => {
    const [dead, live] = await Promise.all([deadTurn(), liveTurn()]);
    const id = fresh();
    const add = (fence: Turn) => {
      const b = db.batch({ fence });
      b.scope("app", id).put("a", 1).append("l", [1]);
      b.scope("user", id).put("b", 2);
      return b.commit();
    };
    const err = await add(dead).catch((e: unknown) => e);
    assert.ok(err instanceof LeaseLost && err.turnId === dead.id, String(err));
    assert.deepEqual([await db.scope("app", id).keys(), await db.scope("user", id).keys()], [[], []]);
    assert.deepEqual(await add(live), [1, { length: 1, version: 1 }, 1]);

    const r = await run();
    await assert.rejects(db.runs.write(r, [{ seq: 0, type: "user" }], { task: "late" }, { fence: dead }), LeaseLost);
    assert.deepEqual([(await db.runs.head(r))?.nextSeq, (await db.runs.head(r))?.snapshot], [0, { task: "calls" }]);
    await db.runs.write(r, [{ seq: 0, type: "user" }], { task: "now" }, { fence: live.id });
    assert.equal((await db.runs.head(r))?.nextSeq, 1);
  });

  it("a bad fence is refused before anything is sent", async () => {
    const s = db.scope("app", fresh());
    await assert.rejects(s.put("k", 1, { fence: 7 as unknown as string }), InvalidValue);
    await assert.rejects(s.put("k", 1, { fence: "bad id" }), { name: "InvalidKey" });
    assert.throws(() => db.scope("app", "x", { fence: { id: 1 } as unknown as string }), InvalidValue);
    assert.throws(() => db.batch({ fence: "a/b" }), { name: "InvalidKey" });
    assert.deepEqual(await s.keys(), []);
  });
});

describe("claim and settle", () => {
  it("claimed, in_progress, done; failed; the entries they append", async () => {
    const r = await run();
    const c = await db.runs.claim(r, "pay-1", { call: { tool: "pay", args: { cents: 500 } } });
    assert.equal(c.status, "claimed");
    assert.deepEqual([c.result, c.error], [undefined, null]);
    assert.deepEqual({ ...c.entry, at: undefined }, { seq: 0, type: "tool_call", call_id: "pay-1", at: undefined,
      fence: null, lease: 300, tool: "pay", args: { cents: 500 } });
    assert.equal(typeof c.entry.at, "string");
    const again = await db.runs.claim(r, "pay-1");
    assert.deepEqual([again.status, again.entry], ["in_progress", c.entry], "a live claim is in progress");
    await db.runs.settle(r, "pay-1", { result: { receipt: "r-1" } });
    const done = await db.runs.claim(r, "pay-1");
    assert.deepEqual([done.status, done.result, done.error], ["done", { receipt: "r-1" }, null]);
    assert.deepEqual(done.entry, { seq: 1, type: "tool_result", call_id: "pay-1", status: "ok", result: { receipt: "r-1" } });
    await assert.rejects(db.runs.settle(r, "pay-1", { result: 2 }), InvalidTransition, "settled already");
    await assert.rejects(db.runs.settle(r, "never-claimed", { result: 2 }), InvalidTransition);

    await db.runs.claim(r, "mail-1");
    await db.runs.settle(r, "mail-1", { error: "SMTPError: refused" });
    const failed = await db.runs.claim(r, "mail-1");
    assert.deepEqual([failed.status, failed.result, failed.error], ["failed", undefined, "SMTPError: refused"]);
    await db.runs.claim(r, "null-1");
    await db.runs.settle(r, "null-1", { result: null });
    assert.deepEqual((await db.runs.claim(r, "null-1")).result, null, "a null result is a result");
    // Python's rule: settle() with nothing records a null result; a result and an error is
    // InvalidValue (SPEC §16), and records nothing.
    await db.runs.claim(r, "bare-1");
    await db.runs.settle(r, "bare-1");
    assert.deepEqual(await db.runs.claim(r, "bare-1"), { status: "done", result: null, error: null,
      entry: { seq: 7, type: "tool_result", call_id: "bare-1", status: "ok", result: null } });
    await db.runs.claim(r, "both-1");
    await assert.rejects(db.runs.settle(r, "both-1", { result: 1, error: "E: e" }), InvalidValue);
    assert.equal((await db.runs.claim(r, "both-1")).status, "in_progress");
    assert.equal((await db.runs.head(r))?.nextSeq, 9);
  });

  it("a claim past its lease is in doubt; retry claims it again", async () => {
    const r = await run();
    await db.runs.claim(r, "c", { lease: 0.05 });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const doubt = await db.runs.claim(r, "c");
    assert.equal(doubt.status, "in_doubt");
    assert.equal(doubt.entry.seq, 0);
    const retried = await db.runs.claim(r, "c", { retry: true });
    assert.deepEqual([retried.status, retried.entry.seq, retried.entry.retry], ["claimed", 1, 1]);
  });

  it("refusals: a missing run, a lapsed fence, a reserved key in call; nothing appended", async () => {
    await assert.rejects(db.runs.claim(fresh("none"), "c"), RunNotFound);
    await assert.rejects(db.runs.settle(fresh("none"), "c", { result: 1 }), RunNotFound);
    const r = await run();
    const dead = await deadTurn();
    const err = await db.runs.claim(r, "c", { fence: dead }).catch((e: unknown) => e);
    assert.ok(err instanceof LeaseLost && err.turnId === dead.id, String(err));
    await assert.rejects(db.runs.claim(r, "c", { call: { seq: 9 } }), InvalidValue);
    await assert.rejects(db.runs.claim(r, "c", { lease: 0 }), InvalidValue);
    await assert.rejects(db.runs.claim(r, "c", { call: [1] as unknown as JsonObject }), InvalidValue);
    await assert.rejects(db.runs.settle(r, "c", { error: 5 as unknown as string }), InvalidValue);
    assert.equal((await db.runs.head(r))?.nextSeq, 0);
    const live = await liveTurn();
    const c = await db.runs.claim(r, "c", { fence: live });
    assert.equal(c.entry.fence, live.id);
    await live.finish();
    await assert.rejects(db.runs.settle(r, "c", { result: 1, fence: live }), LeaseLost);
    assert.equal((await db.runs.claim(r, "c")).status, "in_doubt", "a fenced claim whose turn ended is in doubt");
  });
});

describe("once", () => {
  it("runs fn once and returns its result; sync or async; undefined is recorded as null", async () => {
    const r = await run();
    let calls = 0;
    assert.deepEqual(await db.runs.once(r, "a", async () => { calls++; return { paid: true }; }), { paid: true });
    assert.deepEqual(await db.runs.once(r, "a", () => { calls++; return { paid: false }; }), { paid: true });
    assert.equal(calls, 1);
    assert.equal(await db.runs.once(r, "b", () => undefined), undefined);
    assert.equal(await db.runs.once(r, "b", () => 1), null);
    const loaded = await db.runs.load(r);
    assert.deepEqual(loaded.entries.map((e) => [e.type, e.call_id]),
      [["tool_call", "a"], ["tool_result", "a"], ["tool_call", "b"], ["tool_result", "b"]]);
  });

  it("a cancel (an AbortError from fn) records nothing: the call stays claimed, in doubt later", async () => {
    const r = await run();
    const ac = new AbortController();
    ac.abort();
    const cancelled = await db.runs.once(r, "cut", async () => {
      ac.signal.throwIfAborted(); // a tool cancelled midway: it may have had its effect
      return "never";
    }, { lease: 0.05 }).catch((e: unknown) => e);
    assert.ok(cancelled instanceof Error && cancelled.name === "AbortError", String(cancelled));
    await new Promise((resolve) => setTimeout(resolve, 300));
    const c = await db.runs.claim(r, "cut");
    assert.deepEqual([c.status, c.entry.type], ["in_doubt", "tool_call"], "in doubt, as an interrupt leaves it in Python");
  });

  it("an error from fn is recorded as '<Name>: <message>' and rethrown; later, CallFailed", async () => {
    const r = await run();
    class PaymentDeclined extends Error { override name = "PaymentDeclined"; }
    const thrown = new PaymentDeclined("card expired");
    const err = await db.runs.once(r, "pay", async () => { throw thrown; }).catch((e: unknown) => e);
    assert.equal(err, thrown, "the original error, rethrown");
    const later = await db.runs.once(r, "pay", () => "never").catch((e: unknown) => e);
    assert.ok(later instanceof CallFailed, String(later));
    assert.deepEqual([later.callId, later.error], ["pay", "PaymentDeclined: card expired"]);
    await assert.rejects(db.runs.once(r, "str", () => { throw "just text"; }), (e) => e === "just text");
    assert.equal((await db.runs.claim(r, "str")).error, "just text");
  });

  it("a live claim is CallInProgress; a lapsed one InDoubt with its time, unless reconcile says", async () => {
    const r = await run();
    await db.runs.claim(r, "live");
    const busy = await db.runs.once(r, "live", () => 1).catch((e: unknown) => e);
    assert.ok(busy instanceof CallInProgress && busy.callId === "live", String(busy));

    const claimed = await db.runs.claim(r, "lapsed", { lease: 0.05, call: { tool: "pay" } });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const doubt = await db.runs.once(r, "lapsed", () => 1).catch((e: unknown) => e);
    assert.ok(doubt instanceof InDoubt && doubt.callId === "lapsed", String(doubt));
    assert.ok(doubt.at instanceof Date);
    assert.equal(doubt.at.toISOString().slice(0, 23), (claimed.entry.at as string).slice(0, 23));

    const asked: [string, JsonObject][] = [];
    const boom = new Error("provider down");
    await assert.rejects(db.runs.once(r, "lapsed", () => 1, { reconcile: () => { throw boom; } }), (e) => e === boom);
    assert.equal((await db.runs.claim(r, "lapsed")).status, "in_doubt", "nothing recorded when reconcile throws");
    let ran = false;
    const found = await db.runs.once<unknown>(r, "lapsed", () => { ran = true; return "again"; }, {
      reconcile: async (callId, entry) => { asked.push([callId, entry]); return { receipt: "found" }; } });
    assert.deepEqual([found, ran], [{ receipt: "found" }, false]);
    assert.deepEqual(asked, [["lapsed", claimed.entry]]);
    assert.deepEqual((await db.runs.claim(r, "lapsed")).result, { receipt: "found" });

    await db.runs.claim(r, "redo", { lease: 0.05 });
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal(await db.runs.once(r, "redo", async () => "ran again", { reconcile: () => NOT_RUN }), "ran again");
    const entries = (await db.runs.entries(r)).filter((e) => e.call_id === "redo");
    assert.deepEqual(entries.map((e) => [e.type, e.retry, e.result]),
      [["tool_call", undefined, undefined], ["tool_call", 1, undefined], ["tool_result", undefined, "ran again"]]);
  });

  it("with a fence: LeaseLost before anything is appended; a fence lost while fn ran leaves it in doubt", async () => {
    const r = await run();
    const dead = await deadTurn();
    let calls = 0;
    await assert.rejects(db.runs.once(r, "c", () => ++calls, { fence: dead }), LeaseLost);
    assert.deepEqual([calls, (await db.runs.head(r))?.nextSeq], [0, 0]);

    const t = await liveTurn();
    const err = await db.runs.once(r, "c", async () => { await t.finish(); return ++calls; }, { fence: t })
      .catch((e: unknown) => e);
    assert.ok(err instanceof LeaseLost && err.turnId === t.id, String(err));
    assert.equal(calls, 1);
    const c = await db.runs.claim(r, "c");
    assert.deepEqual([c.status, c.entry.fence], ["in_doubt", t.id]);

    const live = await liveTurn();
    assert.equal(await db.runs.once(r, "d", () => "fenced", { fence: live, call: { tool: "x" } }), "fenced");
    assert.deepEqual((await db.runs.entries(r)).filter((e) => e.call_id === "d").map((e) => [e.type, e.call_id, e.fence ?? null]),
      [["tool_call", "d", live.id], ["tool_result", "d", null]]);
  });

  it("an fn (or reconcile) that is not a function is a UsageError before anything is claimed", async () => {
    const r = await run();
    const charge = () => ({ charged: true });
    for (const bad of [null, undefined, "charge", 42, charge(), Promise.resolve(1)]) {
      await assert.rejects(db.runs.once(r, "c", bad as never), UsageError, String(bad));
    }
    await assert.rejects(db.runs.once(r, "c", charge, { reconcile: "no" as never }), UsageError);
    assert.equal((await db.runs.head(r))?.nextSeq, 0, "nothing claimed");
    assert.deepEqual(await db.runs.once(r, "c", charge), { charged: true }, "the call is still free to run");
  });

  it("a result that cannot be recorded settles the call as failed (ResultNotRecorded) and throws; nothing runs again", async () => {
    const r = await run();
    let calls = 0;
    const cases = [["a Date in it", "date", () => ({ at: new Date() }), InvalidValue],
      ["over a run entry's limit", "huge", () => "x".repeat(16 << 20), TooLarge]] as const;
    for (const [what, callId, result, cls] of cases) {
      const err = await db.runs.once(r, callId, () => { calls++; return result(); }).catch((e: unknown) => e);
      assert.ok(err instanceof cls, `${what}: ${String(err)}`);
      const later = await db.runs.once(r, callId, () => { calls++; return 1; }).catch((e: unknown) => e);
      assert.ok(later instanceof CallFailed, `${what}: later ${String(later)}`);
      assert.equal(later.error, `ResultNotRecorded: ${err.message}`, what);
    }
    assert.equal(calls, 2, "each fn ran once");
    const huge = await db.runs.once(r, "huge2", () => "x".repeat(16 << 20)).catch((e: unknown) => e);
    assert.ok(huge instanceof TooLarge);
    assert.deepEqual([huge.size, huge.limit], [(16 << 20) + 2, (16 << 20) - 1024], "the result's size, the limit a result has");
  });

  it("a result up to a run entry's limit is recorded, over HTTP as locally (not the 4 MiB of a value body)", async () => {
    const r = await run();
    const big = "é".repeat(3 << 20); // 6 MiB of UTF-8
    assert.equal(await db.runs.once(r, "big", () => big), big);
    assert.equal(await db.runs.once(r, "big", () => "again"), big);
  });

  it("a settle names the claim it settles: one whose claim a retry superseded is refused, records nothing", async () => {
    const r = await run();
    const gate = () => { let open!: () => void; const p = new Promise<void>((resolve) => { open = resolve; }); return { p, open }; };
    const [slowGate, fastGate] = [gate(), gate()];
    const calls = async () => (await db.runs.entries(r)).filter((e) => e.call_id === "c");
    // A first claimer whose claim lapses while its fn still runs...
    const slow = db.runs.once(r, "c", async () => { await slowGate.p; return "slow"; }, { lease: 0.05 })
      .catch((e: unknown) => e);
    for (let i = 0; i < 400 && (await calls()).length < 1; i++) await new Promise((resolve) => setTimeout(resolve, 25));
    await new Promise((resolve) => setTimeout(resolve, 300));
    // ...then a second that finds it in doubt, is told it did not run, and claims it again.
    const fast = db.runs.once(r, "c", async () => { await fastGate.p; return "fast"; }, { reconcile: () => NOT_RUN });
    for (let i = 0; i < 400 && (await calls()).length < 2; i++) await new Promise((resolve) => setTimeout(resolve, 25));
    assert.deepEqual((await calls()).map((e) => [e.type, e.retry]), [["tool_call", undefined], ["tool_call", 1]]);
    slowGate.open(); // the first settles now, before the second: refused
    const slowErr = await slow;
    assert.ok(slowErr instanceof InvalidTransition, String(slowErr));
    assert.equal((await calls()).length, 2, "the superseded settle recorded nothing");
    fastGate.open();
    assert.equal(await fast, "fast");
    assert.equal(await db.runs.once(r, "c", () => "never"), "fast");
  });

  it("many callers at once from several clients: fn runs once, every caller gets its result", async () => {
    const r = await run();
    let calls = 0;
    const callers = Array.from({ length: 12 }, () => connect(srv.url, { token: srv.token }));
    const results = await Promise.all(callers.map(async (c, i) => {
      for (;;) {
        try {
          return await c.runs.once(r, "shared", async () => {
            calls++;
            await new Promise((resolve) => setTimeout(resolve, 50));
            return `caller ${i}`;
          });
        } catch (e) {
          if (!(e instanceof CallInProgress)) throw e;
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
      }
    }));
    assert.equal(calls, 1);
    assert.equal(new Set(results).size, 1, results.join());
  });
});
