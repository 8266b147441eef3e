/**
 * What needs no server: the JSON reader and writer, the value checks, the
 * event-stream parser, and every error class as the client makes it from a
 * server's error body or a failed request.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { inspect } from "node:util";

import * as agentstate from "agentstate-db";
import {
  AgentStateError, CursorExpired, InvalidKey, InvalidValue, NotFound, RunNotFound, StorageError, connect,
} from "agentstate-db";
// Internal modules, by path: not part of the package's public surface.
import { encode, parse, rawItems } from "#internal/json.js";
import { EventParser, type SseEvent } from "#internal/feed.js";
import { segment } from "#internal/http.js";

/** A fetch that answers every request with `status` and `body` (an object: JSON), and records the requests. */
export function fakeFetch(status: number, body: unknown, seen: { url: string; init: RequestInit }[] = [],
  type = typeof body === "string" ? "text/html" : "application/json") {
  return async (url: string, init?: RequestInit): Promise<Response> => {
    seen.push({ url, init: init ?? {} });
    return new Response(typeof body === "string" ? body : JSON.stringify(body), { status, headers: { "content-type": type } });
  };
}

const SPEC_6: [string, string, number, Record<string, unknown>, Record<string, unknown>][] = [
  // class, code, status, body fields, the fields the error must carry
  ["InvalidKey", "invalid_key", 400, {}, {}],
  ["InvalidValue", "invalid_value", 400, {}, {}],
  ["TooLarge", "too_large", 413, { size: 2000000, limit: 1048576 }, { size: 2000000, limit: 1048576 }],
  ["VersionConflict", "version_conflict", 409, { current_version: 7 }, { currentVersion: 7 }],
  ["NotAList", "not_a_list", 409, {}, {}],
  ["HistoryGap", "history_gap", 409, {}, {}],
  ["RunExists", "already_exists", 409, {}, {}],
  ["NotFound", "not_found", 404, {}, {}],
  ["SessionBusy", "session_busy", 409, { turn_id: "t-1" }, { turnId: "t-1" }],
  ["InvalidTransition", "invalid_transition", 409, {}, {}],
  ["Forbidden", "forbidden", 403, {}, {}],
  ["Busy", "busy", 503, {}, {}],
  ["Damaged", "damaged", 500, {}, {}],
  ["SchemaTooNew", "schema_too_new", 500, {}, {}],
  ["Closed", "closed", 500, {}, {}],
  ["StorageError", "storage_error", 500, { outcome_unknown: true }, { outcomeUnknown: true }],
  ["CursorExpired", "cursor_expired", 410, {}, {}],
  ["Unauthorized", "unauthorized", 401, {}, {}],
  ["UsageError", "usage_error", 400, {}, {}],
  ["LeaseLost", "lease_lost", 409, { turn_id: "t-2" }, { turnId: "t-2" }],
  ["InDoubt", "in_doubt", 409, { call_id: "c-1", at: "2026-01-02T03:04:05.123456Z" },
    { callId: "c-1", at: new Date("2026-01-02T03:04:05.123Z") }],
  ["CallInProgress", "call_in_progress", 409, { call_id: "c-2" }, { callId: "c-2" }],
  ["CallFailed", "call_failed", 409, { call_id: "c-3", error: "ValueError: no" }, { callId: "c-3", error: "ValueError: no" }],
];

describe("errors", () => {
  for (const [name, code, status, body, fields] of SPEC_6) {
    it(`a ${code} answer is a ${name} with its fields`, async () => {
      const db = connect("http://x.invalid", {
        token: "t", fetch: fakeFetch(status, { error: { code, message: `the ${code} message`, ...body } }) });
      const err = await db.scope("agent", "a").put("k", 1).then(() => null, (e: unknown) => e);
      const cls = (agentstate as unknown as Record<string, new (...a: never[]) => Error>)[name];
      assert.ok(cls, `agentstate exports ${name}`);
      assert.ok(err instanceof cls, `${name}: got ${String(err)}`);
      assert.ok(err instanceof AgentStateError && err instanceof Error);
      assert.equal(err.name, name);
      assert.equal(err.code, code);
      assert.equal(err.status, status);
      assert.equal(err.message, `the ${code} message`);
      for (const [k, v] of Object.entries(fields)) assert.deepEqual((err as unknown as Record<string, unknown>)[k], v, k);
    });
  }

  it("a not_found from a run's route is a RunNotFound, which is a NotFound", async () => {
    const db = connect("http://x.invalid", { token: "t", fetch: fakeFetch(404, { error: { code: "not_found", message: "no run" } }) });
    const err = await db.runs.load("r").catch((e: unknown) => e);
    assert.ok(err instanceof RunNotFound && err instanceof NotFound);
    const err2 = await db.sessions.get("s").catch((e: unknown) => e);
    assert.ok(err2 instanceof NotFound && !(err2 instanceof RunNotFound));
  });

  it("a write whose request failed on the network is a StorageError with outcomeUnknown; a read without", async () => {
    const down = async (): Promise<Response> => { throw new TypeError("fetch failed"); };
    const db = connect("http://x.invalid", { token: "secret-token", fetch: down });
    const w = await db.scope("agent", "a").put("k", 1).catch((e: unknown) => e);
    assert.ok(w instanceof StorageError);
    assert.equal(w.outcomeUnknown, true);
    assert.ok(!w.message.includes("secret-token"), "no token in an error message");
    for (const write of [() => db.scope("agent", "a").append("k", [1]), () => db.runs.write("r", [], null),
      () => db.sessions.create(), () => { const b = db.batch(); b.scope("app", "x").put("k", 1); return b.commit(); }]) {
      const e = await write().catch((x: unknown) => x);
      assert.ok(e instanceof StorageError && e.outcomeUnknown === true, String(e));
    }
    const r = await db.scope("agent", "a").get("k").catch((e: unknown) => e);
    assert.ok(r instanceof StorageError);
    assert.equal(r.outcomeUnknown, false);
  });

  it("an answer that is not an agentstate error is a StorageError (a write's: outcome unknown if 5xx)", async () => {
    const db = connect("http://x.invalid", { token: "t", fetch: fakeFetch(502, "<html>bad gateway</html>") });
    const w = await db.scope("agent", "a").put("k", 1).catch((e: unknown) => e);
    assert.ok(w instanceof StorageError && w.outcomeUnknown === true);
    const r = await db.scope("agent", "a").get("k").catch((e: unknown) => e);
    assert.ok(r instanceof StorageError && r.outcomeUnknown === false);
  });

  it("connect refuses a missing token and a URL that is not http(s)", () => {
    assert.throws(() => connect("http://h", { token: "" }), agentstate.Unauthorized);
    assert.throws(() => connect("ftp://h", { token: "t" }), InvalidValue);
    assert.throws(() => connect("http://h", { token: "t", principal: "a b" }), InvalidKey);
  });

  it("printing a client, a scope or a turn never shows the token", async () => {
    const turn = { id: "t", session_id: "s", n: 1, status: "running", input: null, request: null, decision: null,
      result: null, error: null, lease: 60, lease_until: 1, created_at: "2026-01-01T00:00:00.000000Z",
      updated_at: "2026-01-01T00:00:00.000000Z" };
    const db = connect("http://x.invalid", { token: "s3cret-t0ken", fetch: fakeFetch(201, turn) });
    const t = await db.sessions.startTurn("s");
    const shown = [db, db.scope("app", "x"), db.state({ app: "x" }), db.batch(), t].map((o) => inspect(o, { depth: 20 }));
    assert.ok(shown.every((text) => !text.includes("s3cret-t0ken")), shown.join("\n"));
  });

  it("NOT_RUN is exported, one symbol", () => {
    assert.equal(typeof agentstate.NOT_RUN, "symbol");
    assert.equal(agentstate.NOT_RUN, Symbol.for("agentstate.NOT_RUN"));
  });
});

describe("once's settle", () => {
  it("names the claim it settles: retry 0 for the first claim, the claim entry's retry after", async () => {
    const bodies: [string, string][] = [];
    let claims = 0;
    const f = async (url: string, init?: RequestInit): Promise<Response> => {
      const path = new URL(url).pathname;
      bodies.push([path.split("/").pop()!, String(init?.body)]);
      const answer = path.endsWith("/claim")
        ? (claims++ === 0 && path.includes("/redo/") ? { status: "in_doubt", entry: { type: "tool_call", call_id: "redo" } }
          : { status: "claimed", entry: { type: "tool_call", ...(path.includes("/redo/") ? { retry: 1 } : {}) } })
        : { entry: { type: "tool_result" } };
      return new Response(JSON.stringify(answer), { headers: { "content-type": "application/json" } });
    };
    const db = connect("http://x.invalid", { token: "t", fetch: f });
    await db.runs.once("r", "redo", () => "ran", { reconcile: () => agentstate.NOT_RUN });
    claims = 1;
    await db.runs.once("r", "first", () => { throw new Error("no"); }).catch(() => undefined);
    assert.deepEqual(bodies, [["claim", "{}"], ["claim", '{"retry":true}'], ["settle", '{"result":"ran","retry":1}'],
      ["claim", "{}"], ["settle", '{"error":"Error: no","retry":0}']]);
  });
});

describe("reading JSON", () => {
  it("keeps integers outside ±(2^53-1) exact, as bigints where they stand", () => {
    const text = '{"a":[9007199254740991,9007199254740992,-9007199254740993,9223372036854775807,' +
      '-9223372036854775808],"b":{"c":12345678901234567890123},"d":1e+16,"e":1.5,"f":"12345678901234567"}';
    assert.deepEqual(parse(text), {
      a: [9007199254740991, 9007199254740992n, -9007199254740993n, 9223372036854775807n, -9223372036854775808n],
      b: { c: 12345678901234567890123n }, d: 1e16, e: 1.5, f: "12345678901234567" });
  });

  it("agrees with JSON.parse on everything else (escapes, nesting, floats, __proto__, whitespace)", () => {
    const samples = [
      '{"s":"a\\"b\\\\c\\n\\u00e9\\ud83d\\ude00\\u2028","n":-0,"f":0.30000000000000004,"x":[true,false,null,{}],' +
      '"__proto__":{"polluted":1},"deep":[[[[1234567890123456]]]]}',
      ' [ 1 , 2.5e-7 ,\n"\u00e9" ] ',
      '"just a string with 1234567890123456 digits"',
      "1234567890123456",
    ];
    for (const t of samples) {
      const got = parse(t);
      assert.deepEqual(got, JSON.parse(t));
    }
    const o = parse(samples[0]!) as Record<string, unknown>;
    assert.equal(Object.getPrototypeOf(o), Object.prototype, "__proto__ is an own key, never the prototype");
    assert.deepEqual(Object.keys(o).includes("__proto__"), true);
  });

  it("refuses what is not JSON", () => {
    for (const t of ['{"a":1234567890123456', "[1234567890123456,]", '{"a" 1}', "12345678901234567x", '"\t1234567890123456"']) {
      assert.throws(() => parse(t), SyntaxError, t);
    }
  });
});

describe("writing JSON", () => {
  it("writes Python's compact text: separators, raw UTF-8, Python's float spelling, bigints exactly", () => {
    const v = { b: "é\u2028\u0001\"\\", n: [1, -2, 0.5, 1e-7, 0.00001, 0.0001, -2.5e-10, 123.456], big: 2n ** 63n - 1n };
    assert.equal(encode(v), '{"b":"é\u2028\\u0001\\"\\\\","n":[1,-2,0.5,1e-07,1e-05,0.0001,-2.5e-10,123.456],' +
      '"big":9223372036854775807}');
    assert.equal(encode({ a: 1, skip: undefined }), '{"a":1}');
  });

  it("refuses what JavaScript allows and the store does not, as InvalidValue", () => {
    class Thing { x = 1; }
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    let deep: unknown = [];
    for (let i = 1; i < 513; i++) deep = [deep];
    const bad: [string, unknown][] = [
      ["NaN", NaN], ["Infinity", Infinity], ["-Infinity", [-Infinity]], ["2^53", 2 ** 53], ["-2^53", { a: -(2 ** 53) }],
      ["1e300", 1e300], ["bigint 2^63", 2n ** 63n], ["bigint -2^63-1", -(2n ** 63n) - 1n],
      ["lone high surrogate", "a\ud800"], ["lone low surrogate", ["\udc00b"]], ["surrogate in a key", { "\ud800": 1 }],
      ["NUL", "a\0b"], ["NUL in a key", { "a\0": 1 }], ["depth 513", deep], ["cycle", cyclic],
      ["Date", new Date()], ["Map", new Map()], ["Set", new Set()], ["class instance", new Thing()],
      ["function", () => 1], ["undefined in an array", [1, undefined]], ["a hole", [1, , 3]], ["undefined", undefined],
      ["symbol", Symbol("s")], ["Uint8Array", new Uint8Array(1)], ["boxed number", Object(1)],
    ];
    for (const [what, value] of bad) assert.throws(() => encode(value), InvalidValue, what);
    let ok: unknown = [];
    for (let i = 1; i < 512; i++) ok = [ok];
    assert.doesNotThrow(() => encode(ok), "512 levels are allowed");
    assert.equal(encode([2 ** 53 - 1, -(2 ** 53 - 1), -(2n ** 63n)]), "[9007199254740991,-9007199254740991,-9223372036854775808]");
    assert.equal(encode(Object.create(null)), "{}");
  });

  it("a refused value sends nothing", async () => {
    const seen: { url: string; init: RequestInit }[] = [];
    const db = connect("http://x.invalid", { token: "t", fetch: fakeFetch(200, { version: 1 }, seen) });
    const s = db.scope("agent", "a");
    for (const call of [() => s.put("k", NaN), () => s.append("k", [new Date()]), () => s.update("k", () => 2 ** 60),
      () => s.put("bad key", 1), () => db.runs.write("r", [{ seq: 0, t: Infinity }], null)]) {
      await assert.rejects(call(), AgentStateError);
    }
    assert.equal(seen.filter((r) => r.init.method !== "GET").length, 0);
    assert.throws(() => db.scope("nope" as "app", "x"), InvalidKey);
    assert.throws(() => db.scope("app", "x/y"), InvalidKey);
    assert.throws(() => db.batch().scope("app", "x").put("k", "\0"), InvalidValue);
  });
});

describe("paths", () => {
  it("keys '.' and '..' are sent as '~.' and '~..', which no URL parser removes", () => {
    assert.equal(segment("."), "~.");
    assert.equal(segment(".."), "~..");
    assert.equal(segment("a.b"), "a.b");
    assert.equal(segment("a:b"), "a%3Ab");
    for (const k of [".", ".."]) {
      const u = new URL(`http://h/v1/scopes/app/x/keys/${segment(k)}/length`);
      assert.equal(u.pathname, `/v1/scopes/app/x/keys/~${k}/length`);
    }
  });
});

describe("fences", () => {
  it("X-Agentstate-Fence names the turn on every write of a fenced scope, batch or run, and on no read", async () => {
    const seen: { url: string; init: RequestInit }[] = [];
    const answer = { key: "k", value: 1, version: 1, deleted: true, length: 1, items: [], touched: true, expires_at: null, cleared: 0,
      values: {}, keys: [], next: null, results: [], written: true, status: "claimed", entry: {} };
    const db = connect("http://x.invalid", { token: "t", fetch: fakeFetch(200, answer, seen) });
    const fenceOf = (i: number) => new Headers(seen[i]!.init.headers).get("x-agentstate-fence");
    const turn = { id: "t-7" }; // a Turn, or anything with the turn's id
    const s = db.scope("agent", "a", { fence: turn });
    const writes = [() => s.put("k", 1), () => s.putBytes("k", new Uint8Array(1)), () => s.delete("k"),
      () => s.append("k", [1]), () => s.pop("k"), () => s.touch("k", 5), () => s.clear(),
      () => db.state({ user: "u", fence: "t-7" }).user.put("k", 1),
      () => { const b = db.batch({ fence: turn }); b.scope("app", "x").put("k", 1); return b.commit(); },
      () => db.runs.write("r", [], null, { fence: turn }), () => db.runs.claim("r", "c", { fence: "t-7" }),
      () => db.runs.settle("r", "c", { result: 1, fence: turn })];
    for (const w of writes) {
      seen.length = 0;
      await w();
      assert.deepEqual(seen.map((_, i) => fenceOf(i)), ["t-7"], String(w));
    }
    seen.length = 0;
    await s.put("k", 1, { fence: "t-8" });
    assert.equal(fenceOf(0), "t-8", "the write's own fence, not the scope's");
    seen.length = 0;
    for (const read of [() => s.get("k"), () => s.getMany(["k"]), () => s.items(), () => s.keys(), () => s.length("k")]) {
      await read();
    }
    assert.deepEqual(seen.map((_, i) => fenceOf(i)), [null, null, null, null, null]);
    seen.length = 0;
    await db.scope("agent", "a").put("k", 1);
    assert.equal(fenceOf(0), null, "an unfenced scope sends none");
  });
});

describe("raw entries", () => {
  it("cuts each item's text out of an answer, whatever its strings and nesting hold", () => {
    const items = ['{"a":"x,y]}\\\\"}', '{"b":[1,{"c":"\\\\\\"],"}],"d":{}}', "[]", '"s"', "12345678901234567890", "null"];
    for (const t of items) JSON.parse(t); // each is JSON
    assert.deepEqual(rawItems(`{"entries":[${items.join(",")}]}`, "entries"), items);
    assert.deepEqual(rawItems(` { "other" : [1,2] , "entries" : [ ${items.join(" ,\n ")} ] } `, "entries"), items);
    assert.deepEqual(rawItems('{"entries":[]}', "entries"), []);
    for (const bad of ['{"entries":{}}', '{"other":[]}', "[]", '{"entries":["x]}']) {
      assert.throws(() => rawItems(bad, "entries"), SyntaxError, bad);
    }
  });
});

describe("server-sent events", () => {
  it("parses events split anywhere, with LF, CRLF or CR line ends, comments, multi-line data and ids", () => {
    const stream = ": hello\n\nid\n\nid: 1\ndata: {\"a\":1}\n\r\nevent: error\r\ndata: x\rdata: y\r\r: keep-alive\n\n" +
      "data:z\nid:2\n\nid: 3\0\n\n";
    for (let size = 1; size <= stream.length; size++) {
      const p = new EventParser();
      const got: SseEvent[] = [];
      for (let i = 0; i < stream.length; i += size) got.push(...p.push(stream.slice(i, i + size)));
      assert.deepEqual(got, [{ type: "message", data: null, id: "" }, { type: "message", data: '{"a":1}', id: "1" },
        { type: "error", data: "x\ny", id: "1" }, { type: "message", data: "z", id: "2" }], `chunks of ${size}`);
    }
  });

  it("an error event ends the subscription with its error (a cursor that expired: CursorExpired)", async () => {
    const body = 'data: {"error":{"code":"cursor_expired","message":"gone"}}\n\n';
    const db = connect("http://x.invalid", { token: "t", fetch: fakeFetch(200, body, [], "text/event-stream") });
    await assert.rejects(async () => { for await (const _ of db.subscribe(0)) { /* none */ } }, CursorExpired);
  });
});
