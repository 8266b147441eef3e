/**
 * TypeScript and Python on one store: values byte for byte in both
 * directions, the numbers rules, concurrent updates from both languages
 * losing nothing, reads in one call and stored entries alike in both, tool
 * calls claimed in one language seen in the other and run once however both
 * race, and a subscription that outlives a server restart.
 */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { spawn, type ChildProcess } from "node:child_process";

import {
  CallInProgress, connect, InDoubt, InvalidTransition, LeaseLost, NOT_RUN, type Change, type Database, type JsonValue,
} from "agentstate-db";
import { parse } from "#internal/json.js";
import { PyWorker, pythonProcess, serve, type Served } from "./server.js";

let srv: Served;
let db: Database;
let worker: PyWorker;

before(async () => {
  srv = await serve();
  db = connect(srv.url, { token: srv.token });
  worker = new PyWorker(srv.db, parse);
});
after(async () => {
  await worker?.close();
  await srv?.close();
});

/** Python on the store's file (not through the server): `db` and `inp` are set; answers `out`. */
function py(code: string, input?: unknown): Promise<unknown> {
  return worker.run(code, input);
}

/** A client whose request bodies are recorded. */
function recording(): { db: Database; bodies: string[] } {
  const bodies: string[] = [];
  const f = async (url: string, init?: RequestInit) => {
    if (typeof init?.body === "string") bodies.push(init.body);
    return fetch(url, init);
  };
  return { db: connect(srv.url, { token: srv.token, fetch: f }), bodies };
}

function randomFloats(n: number): number[] {
  let x = 12345;
  const next = () => ((x = (x * 1103515245 + 12345) % 2147483648) / 2147483648);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const v = (next() - 0.5) * 10 ** Math.floor(next() * 24 - 16);
    out.push(Number.isInteger(v) ? v + 0.5 : v);
  }
  return out;
}

describe("values between TypeScript and Python", () => {
  it("what TypeScript sends is stored byte for byte (Python's get_bytes)", async () => {
    const { db: rec, bodies } = recording();
    const values: JsonValue[] = [
      { text: "é ü 漢字 😀 \u2028 \u007f \u0001 \t\n\"\\/", nested: [[{ a: [] }], {}], t: true, f: false, n: null },
      [0, -1, 9007199254740991, -9007199254740991, 2n ** 53n, -(2n ** 63n), 2n ** 63n - 1n],
      [0.1, -2.5, 1e-7, 0.00001, 0.0001, 123.456, 5e-324, 2.5e-300, 1.5e15 + 0.5, -0],
      randomFloats(500),
      JSON.parse('{"__proto__":{"x":1},"constructor":"c"}') as JsonValue,
      "",
      Array.from({ length: 50 }, (_, i) => ({ i, s: "x".repeat(i) })),
    ];
    const s = rec.scope("app", "interop-out");
    for (let i = 0; i < values.length; i++) await s.put(`v${i}`, values[i]);
    const sent = bodies.map((b) => b.slice('{"value":'.length, -1)); // put bodies: {"value":TEXT}
    const stored = (await py(
      "s = db.scope('app', 'interop-out')\n" +
      "out = [base64.b64encode(s.get_bytes(f'v{i}')).decode() for i in range(inp)]",
      values.length)) as string[];
    for (let i = 0; i < values.length; i++) {
      assert.equal(Buffer.from(stored[i]!, "base64").toString("utf8"), sent[i], `value ${i}`);
    }
  });

  it("what Python writes reads back equal in TypeScript, big integers as bigints", async () => {
    await py(
      "s = db.scope('app', 'interop-in')\n" +
      "s.put('ints', [2**53 - 1, -(2**53 - 1), 2**53, -(2**53) - 1, 2**62, 2**63 - 1, -(2**63), 0])\n" +
      "s.put('floats', [1.0, 1e16, 0.1, -0.0, 1e-07, 2.5, 1.7976931348623157e308])\n" +
      "s.put('doc', {'name': 'ü 😀', 'list': [None, True, False, {}], 'deep': {'a': {'b': [[]]}}})\n" +
      "s.append('history', [{'role': 'user', 'n': 2**60}])\n");
    const s = db.scope("app", "interop-in");
    assert.deepEqual(await s.get("ints"), [9007199254740991, -9007199254740991, 9007199254740992n, -9007199254740993n,
      4611686018427387904n, 9223372036854775807n, -9223372036854775808n, 0]);
    const floats = (await s.get("floats")) as number[];
    assert.deepEqual(floats, [1, 1e16, 0.1, -0, 1e-7, 2.5, 1.7976931348623157e308]);
    assert.ok(Object.is(floats[3], -0) && typeof floats[1] === "number", "a float stays a number");
    assert.deepEqual(await s.get("doc"), { name: "ü 😀", list: [null, true, false, {}], deep: { a: { b: [[]] } } });
    assert.deepEqual(await s.slice("history"), [{ role: "user", n: 1152921504606846976n }]);

    // A float past 2^53 reads as a number, and is not written back (an integer-valued number there
    // may have been rounded: SPEC §13 refuses them all); the others round-trip.
    await assert.rejects(s.put("floats-back", floats), { name: "InvalidValue" });
    await s.put("floats-small", floats.filter((f) => Math.abs(f) < 2 ** 53));
    assert.equal(await py("s = db.scope('app', 'interop-in')\n" +
      "out = s.get('floats-small') == [f for f in s.get('floats') if abs(f) < 2**53]"), true);
    // Read in TypeScript, written back, read in Python: equal values (Python's ==).
    for (const k of ["ints", "doc"]) await s.put(`${k}-back`, (await s.get(k)) as JsonValue);
    const same = await py("s = db.scope('app', 'interop-in')\n" +
      "out = [s.get(k) == s.get(k + '-back') for k in ('ints', 'doc')]");
    assert.deepEqual(same, [true, true]);
    const bytes = await py("out = base64.b64encode(db.scope('app', 'interop-in').get_bytes('ints')).decode()");
    assert.deepEqual(await s.getBytes("ints"), new Uint8Array(Buffer.from(bytes as string, "base64")));
  });

  it("an integer past ±(2^53-1) is written only as a bigint", async () => {
    const s = db.scope("app", "interop-numbers");
    await assert.rejects(s.put("n", 2 ** 53), { name: "InvalidValue" });
    await s.put("n", 2n ** 60n + 1n);
    assert.equal(await py("out = db.scope('app', 'interop-numbers').get('n')"), 1152921504606846977n);
    assert.equal(await s.get("n"), 1152921504606846977n);
    assert.equal(await s.update<bigint>("n", (v) => (v ?? 0n) + 1n), 1152921504606846978n);
  });
});

describe("updates from both languages at once", () => {
  it("4 TypeScript clients and 4 Python processes incrementing one key lose nothing", async () => {
    const N = 30;
    const key = "counter";
    // Two Python processes on the file itself, two through the server (the Python remote client).
    const code = "import sys, agentstate\n" +
      "db = agentstate.open(sys.argv[1]) if sys.argv[2] == 'file' else agentstate.connect(sys.argv[3], token=sys.argv[4])\n" +
      "s = db.scope('app', 'race')\n" +
      "print('ready', flush=True)\n" +
      "sys.stdin.readline()\n" +
      "for _ in range(int(sys.argv[5])):\n" +
      "    s.update('counter', lambda n: n + 1, default=0)\n" +
      "print('done', flush=True)\n";
    const procs = ["file", "file", "http", "http"].map((how) =>
      pythonProcess(code, [srv.db, how, srv.url, srv.token, String(N)]));
    const outputs = procs.map((p) => {
      let out = "";
      let err = "";
      p.stdout!.on("data", (b: Buffer) => { out += b.toString(); });
      p.stderr!.on("data", (b: Buffer) => { err += b.toString(); });
      const exited = new Promise<number | null>((resolve) => p.on("close", resolve));
      return { ready: () => out.includes("ready"), exited, text: () => out + err };
    });
    const deadline = Date.now() + 60_000;
    while (!outputs.every((o) => o.ready())) {
      assert.ok(Date.now() < deadline, `the Python processes did not start: ${outputs.map((o) => o.text()).join("\n")}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    for (const p of procs) p.stdin!.write("go\n");
    const clients = Array.from({ length: 4 }, () => connect(srv.url, { token: srv.token }));
    await Promise.all(clients.map(async (c) => {
      for (let i = 0; i < N; i++) await c.scope("app", "race").update<number>(key, (n) => n + 1, { default: 0 });
    }));
    const codes = await Promise.all(outputs.map((o) => o.exited));
    assert.deepEqual(codes, [0, 0, 0, 0], outputs.map((o) => o.text()).join("\n"));
    assert.equal(await db.scope("app", "race").get(key), 8 * N);
  });
});

describe("reads in one call, in both languages", () => {
  it("getMany gives what Python's get_many gives", async () => {
    const keys = ["a", "big", "l", "bj", "absent", "f"];
    const python = await py(
      "s = db.scope('user', 'interop-many')\n" +
      "s.put('a', {'x': [1, 2.5, None], 'é': 'ü'})\n" +
      "s.put('big', [2**63 - 1, -(2**53) - 1]); s.put('big', [2**63 - 1, -(2**53) - 1])\n" +
      "s.append('l', [1, 'two']); s.append('l', [{'three': 3}])\n" +
      "s.put_bytes('bj', b'{\"j\": 1.0}')\n" +
      "s.put('f', 1e-07)\n" +
      "out = [[k, v.value, v.version] for k, v in s.get_many(inp).items()]", keys);
    const got = await db.scope("user", "interop-many").getMany(keys);
    assert.deepEqual(Object.entries(got).map(([k, v]) => [k, v.value === undefined ? null : v.value, v.version]), python);
    assert.deepEqual(got.absent, { value: undefined, version: 0 });
    assert.deepEqual(got.big, { value: [9223372036854775807n, -9007199254740993n], version: 2 });
  });

  it("items gives what Python's items gives, page by page", async () => {
    const python = await py(
      "s = db.scope('user', 'interop-items')\n" +
      "s.put('a:1', {'x': [1, 2.5, None], 'é': 'ü'}); s.put('a:2', 2**63 - 1); s.put('a:2', -(2**53) - 1)\n" +
      "s.append('a:3', [1, 'two']); s.put_bytes('a:4', b'{\"j\": 1.0}'); s.put('a:5', 1e-07); s.put('b', True)\n" +
      "out = [[[k, v.value, v.version] for k, v in s.items('a:', after=after, limit=2)]\n" +
      "       for after in (None, 'a:2', 'a:4')]") as unknown[][];
    const s = db.scope("user", "interop-items");
    const pages = [];
    for (const after of [undefined, "a:2", "a:4"]) {
      pages.push((await s.items({ prefix: "a:", after, limit: 2 })).map(([k, v]) => [k, v.value, v.version]));
    }
    assert.deepEqual(pages, python);
    assert.deepEqual(pages.flat().map((i) => i[0]), ["a:1", "a:2", "a:3", "a:4", "a:5"]);
    assert.deepEqual(pages[0]![1], ["a:2", -9007199254740993n, 2]);
  });

  it("raw entries are the text Python's entries(raw=True) gives, byte for byte", async () => {
    const python = await py(
      "db.runs.write('interop-raw', [{'seq': 0, 'type': 'user', 'content': 'é \"q\" ]}', 'f': 1.0, 'n': 2**62},\n" +
      "    {'seq': 1, 'type': 'tool_call', 'call_id': 'c', 'args': {'x': [[], {}], 'e': 1e-07}}], {'task': 't'},\n" +
      "    create=True)\n" +
      "out = db.runs.entries('interop-raw', raw=True)") as string[];
    assert.equal(python.length, 2);
    assert.deepEqual(await db.runs.entries("interop-raw", { raw: true }), python);
    assert.ok(python[0]!.includes('"f":1.0'), "Python's own spelling, kept as stored");
  });
});

/** Resolve once `p` has printed `text` (its stdout), else reject when it exits. */
function printed(p: ChildProcess, text: string, out: { text: string }): Promise<void> {
  return new Promise((resolve, reject) => {
    const check = () => { if (out.text.includes(text)) resolve(); };
    p.stdout!.on("data", check);
    p.on("close", (code) => reject(new Error(`exited ${code} before printing ${text}: ${out.text}`)));
    check();
  });
}

function collect(p: ChildProcess): { text: string; err: string; exited: Promise<number | null> } {
  const out = { text: "", err: "", exited: new Promise<number | null>((resolve) => p.on("close", resolve)) };
  p.stdout!.on("data", (b: Buffer) => { out.text += b.toString(); });
  p.stderr!.on("data", (b: Buffer) => { out.err += b.toString(); });
  return out;
}

describe("tool calls between TypeScript and Python", () => {
  it("a call claimed from Python is in progress from TypeScript, and the other way round", async () => {
    const run = "interop-claims";
    await db.runs.write(run, [], { task: "claims" }, { create: true });
    assert.equal(await py("out = db.runs.claim(inp, 'py-call', call={'tool': 'pay'}).status", run), "claimed");
    const seen = await db.runs.claim(run, "py-call");
    assert.deepEqual([seen.status, seen.entry.tool], ["in_progress", "pay"]);
    const err = await db.runs.once(run, "py-call", () => "never").catch((e: unknown) => e);
    assert.ok(err instanceof CallInProgress && err.callId === "py-call", String(err));

    assert.equal((await db.runs.claim(run, "ts-call", { call: { tool: "mail" } })).status, "claimed");
    assert.deepEqual(await py(
      "c = db.runs.claim(inp, 'ts-call')\n" +
      "try:\n" +
      "    db.runs.once(inp, 'ts-call', lambda: 'never')\n" +
      "except agentstate.CallInProgress as e:\n" +
      "    out = [c.status, c.entry['tool'], e.call_id]\n", run), ["in_progress", "mail", "ts-call"]);

    await db.runs.settle(run, "py-call", { result: { from: "ts" } });
    assert.deepEqual(await py("out = db.runs.once(inp, 'py-call', lambda: 'never')", run), { from: "ts" });
    await py("db.runs.settle(inp, 'ts-call', error='SMTPError: refused')", run);
    const failed = await db.runs.once(run, "ts-call", () => "never").catch((e: unknown) => e);
    assert.ok(failed instanceof Error && (failed as { error?: string }).error === "SMTPError: refused", String(failed));
  });

  it("once from 4 TypeScript and 4 Python processes racing on the same call ids runs each effect once", async () => {
    const N = 12;
    const run = "interop-once-race";
    await db.runs.write(run, [], { task: "race" }, { create: true });
    const client = new URL("../../dist/index.js", import.meta.url).href;
    const tsCode = `
      const { connect, CallInProgress } = await import(process.env.CLIENT);
      const [url, token, run, who, n, start] = process.argv.slice(1);
      const db = connect(url, { token });
      const effects = db.scope("app", "interop-effects");
      await effects.length(run); // the connection made before the start
      console.log("ready");
      await new Promise((resolve) => process.stdin.once("data", resolve));
      const results = {};
      for (let j = 0; j < Number(n); j++) {
        const id = "call-" + ((j + Number(start)) % Number(n));
        for (;;) {
          try {
            results[id] = await db.runs.once(run, id, async () => {
              await effects.append(run, [who + ":" + id]);
              await new Promise((resolve) => setTimeout(resolve, 50)); // a tool takes a while
              return who + ":" + id;
            });
            break;
          } catch (e) {
            if (!(e instanceof CallInProgress)) throw e;
            await new Promise((resolve) => setTimeout(resolve, 10));
          }
        }
      }
      console.log(JSON.stringify(results));
      process.stdin.destroy();`;
    const pyCode = "import sys, json, time, agentstate\n" +
      "url, token, run, who, n, start, how, path = sys.argv[1:]\n" +
      "db = agentstate.open(path) if how == 'file' else agentstate.connect(url, token=token)\n" +
      "effects = db.scope('app', 'interop-effects')\n" +
      "effects.length(run)\n" +
      "print('ready', flush=True)\n" +
      "sys.stdin.readline()\n" +
      "results = {}\n" +
      "for j in range(int(n)):\n" +
      "    cid = f'call-{(j + int(start)) % int(n)}'\n" +
      "    def fn():\n" +
      "        effects.append(run, [f'{who}:{cid}'])\n" +
      "        time.sleep(0.05)\n" +
      "        return f'{who}:{cid}'\n" +
      "    while True:\n" +
      "        try:\n" +
      "            results[cid] = db.runs.once(run, cid, fn)\n" +
      "            break\n" +
      "        except agentstate.CallInProgress:\n" +
      "            time.sleep(0.01)\n" +
      "print(json.dumps(results), flush=True)\n";
    // Worker i of each language starts at call (i * N/4) and goes round all N: the two
    // languages' workers i race head to head from their first call, and meet the others' later.
    const start = (i: number) => String((i * N) / 4);
    const procs: ChildProcess[] = [];
    for (let i = 0; i < 4; i++) {
      procs.push(spawn(process.execPath,
        ["--input-type=module", "-e", tsCode, srv.url, srv.token, run, `ts${i}`, String(N), start(i)],
        { stdio: ["pipe", "pipe", "pipe"], env: { ...process.env, CLIENT: client } }));
    }
    for (const [i, how] of ["file", "http", "file", "http"].entries()) {
      procs.push(pythonProcess(pyCode, [srv.url, srv.token, run, `py${i}-${how}`, String(N), start(i), how, srv.db]));
    }
    try {
      const outs = procs.map(collect);
      await Promise.all(procs.map((p, i) => printed(p, "ready", outs[i]!)));
      for (const p of procs) p.stdin!.write("go\n");
      const codes = await Promise.all(outs.map((o) => o.exited));
      assert.deepEqual(codes, procs.map(() => 0), outs.map((o) => o.text + o.err).join("\n"));
      const results = outs.map((o) => JSON.parse(o.text.trim().split("\n").pop()!) as Record<string, string>);
      const effects = await db.scope("app", "interop-effects").slice<string>(run);
      assert.equal(effects.length, N, `each effect once: ${effects.join(" ")}`);
      const byCall = Object.fromEntries(effects.map((e) => [e.slice(e.indexOf(":") + 1), e]));
      assert.deepEqual(Object.keys(byCall).sort(), Array.from({ length: N }, (_, i) => `call-${i}`).sort());
      for (const r of results) assert.deepEqual(r, byCall, "every caller got the result of the one run");
      const entries = await db.runs.entries(run);
      assert.equal(entries.length, 2 * N, "one claim and one result per call, no retry");
    } finally {
      for (const p of procs) if (p.exitCode === null) p.kill("SIGKILL");
    }
  });
});

describe("a stale worker in TypeScript, the worker that took over in Python", () => {
  it("the fence rejects every write of the TypeScript turn whose lease lapsed, once Python's turn runs", async () => {
    const session = await db.sessions.create();
    const stale = await db.sessions.startTurn(session.id, { lease: 1 });
    const scope = `interop-fence-${session.id}`;
    const s = db.scope("user", scope, { fence: stale });
    assert.equal(await s.put("owner", "ts"), 1, "written while the TypeScript turn holds its lease");
    await db.runs.write(scope, [], { task: "fenced" }, { create: true });
    // Python takes the session over as soon as the TypeScript turn's lease has lapsed.
    const taken = await py(
      "import time\n" +
      "p = agentstate.Principal('ts-admin', admin=True)\n" +
      "deadline = time.monotonic() + 60\n" +
      "while True:\n" +
      "    try:\n" +
      "        t = db.sessions.start_turn(inp[0], p, lease=60)\n" +
      "        break\n" +
      "    except agentstate.SessionBusy:\n" +
      "        assert time.monotonic() < deadline, 'the lease never lapsed'\n" +
      "        time.sleep(0.05)\n" +
      "db.scope('user', inp[1], fence=t).put('owner', 'py')\n" +
      "out = t.id", [session.id, scope]) as string;

    const err = await s.put("owner", "ts, late").catch((e: unknown) => e);
    assert.ok(err instanceof LeaseLost && err.turnId === stale.id, String(err));
    const b = db.batch({ fence: stale });
    b.scope("user", scope).put("owner", "ts, batched").put("other", 1);
    await assert.rejects(b.commit(), (e) => e instanceof LeaseLost && e.turnId === stale.id);
    let ran = 0;
    await assert.rejects(db.runs.once(scope, "pay", () => ++ran, { fence: stale }), LeaseLost);
    await assert.rejects(stale.heartbeat(), InvalidTransition, "a lapsed turn cannot come back once another started");
    assert.deepEqual([await s.getVersioned("owner"), await s.keys(), ran, (await db.runs.head(scope))?.nextSeq],
      [{ value: "py", version: 2 }, ["owner"], 0, 0], "nothing of the stale turn's landed");

    // Python's turn fences TypeScript's writes as well as its own.
    assert.equal(await db.scope("user", scope, { fence: taken }).put("owner", "ts for py"), 3);
    assert.equal(await py("out = db.scope('user', inp).get('owner')", scope), "ts for py");
  });
});

describe("a TypeScript once() whose process is killed", () => {
  it("is in doubt once its claim lapses, and reconciled from either language: no second effect", async () => {
    const run = "interop-killed";
    await db.runs.write(run, [], { task: "killed" }, { create: true });
    const client = new URL("../../dist/index.js", import.meta.url).href;
    // fn prints once it runs (the claim is on the server by then) and waits to be killed:
    // "before" has not done the effect yet, "after" has (and not recorded it).
    const tsCode = `
      const { connect } = await import(process.env.CLIENT);
      const [url, token, run, callId, when] = process.argv.slice(1);
      const db = connect(url, { token });
      const effects = db.scope("app", "interop-killed-effects");
      setInterval(() => {}, 1000); // stay alive until killed
      await db.runs.once(run, callId, async () => {
        if (when === "after") await effects.append(run, [callId]);
        console.log("in fn");
        await new Promise(() => {});
      }, { call: { tool: "pay", key: callId }, lease: 1 });`;
    for (const [callId, when] of [["pay-a", "before"], ["pay-b", "after"]]) {
      const p = spawn(process.execPath, ["--input-type=module", "-e", tsCode, srv.url, srv.token, run, callId!, when!],
        { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, CLIENT: client } });
      try {
        await printed(p, "in fn", collect(p));
      } finally {
        p.kill("SIGKILL");
      }
    }
    // Claimed, no result: in progress while the claim's lease runs, then in doubt.
    for (const callId of ["pay-a", "pay-b"]) {
      const deadline = Date.now() + 60_000;
      for (;;) {
        const c = await db.runs.claim(run, callId);
        assert.ok(c.status === "in_progress" || c.status === "in_doubt", `${callId}: ${c.status}`);
        if (c.status === "in_doubt") break;
        assert.ok(Date.now() < deadline, `${callId}: never in doubt`);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
    const doubt = await db.runs.once(run, "pay-a", () => "never").catch((e: unknown) => e);
    assert.ok(doubt instanceof InDoubt && doubt.callId === "pay-a", String(doubt));
    assert.equal(await py("try:\n    db.runs.once(inp, 'pay-b', lambda: 'never')\n" +
      "except agentstate.InDoubt as e:\n    out = e.call_id\n", run), "pay-b");

    // Reconciled by the payment provider's record (the effects list), keyed by the call id.
    const effects = db.scope("app", "interop-killed-effects");
    assert.deepEqual(await effects.slice(run), ["pay-b"], "only pay-b's effect happened");
    const reconcileCode =
      "effects = db.scope('app', 'interop-killed-effects')\n" +
      "def reconcile(call_id, entry):\n" +
      "    assert entry['key'] == call_id and entry['type'] == 'tool_call'\n" +
      "    return {'paid': call_id} if call_id in (effects.get(inp[0]) or []) else agentstate.NOT_RUN\n" +
      "def fn():\n" +
      "    effects.append(inp[0], [inp[1]])\n" +
      "    return {'paid': inp[1], 'by': 'fn'}\n" +
      "out = db.runs.once(inp[0], inp[1], fn, reconcile=reconcile)\n";
    const tsReconcile = async (callId: string) =>
      ((await effects.get<string[]>(run, [])).includes(callId) ? { paid: callId } : NOT_RUN);
    let tsRan = 0;
    const tsFn = async () => { tsRan++; await effects.append(run, ["pay-b"]); return { paid: "pay-b", by: "fn" }; };
    // pay-a did not happen: Python's reconcile says NOT_RUN and runs it; pay-b did: TypeScript's finds it.
    assert.deepEqual(await py(reconcileCode, [run, "pay-a"]), { paid: "pay-a", by: "fn" });
    assert.deepEqual(await db.runs.once(run, "pay-b", tsFn, { reconcile: tsReconcile }), { paid: "pay-b" });
    assert.equal(tsRan, 0);
    // Settled now: neither language runs or reconciles anything again.
    assert.deepEqual(await db.runs.once(run, "pay-a", tsFn, { reconcile: tsReconcile }), { paid: "pay-a", by: "fn" });
    assert.deepEqual(await py(reconcileCode, [run, "pay-b"]), { paid: "pay-b" });
    assert.deepEqual([await effects.slice(run), tsRan], [["pay-b", "pay-a"], 0], "each effect once");
    const entries = await db.runs.entries(run);
    assert.deepEqual(entries.map((e) => [e.call_id, e.type, e.retry ?? null, e.status ?? null]), [
      ["pay-a", "tool_call", null, null], ["pay-b", "tool_call", null, null],
      ["pay-a", "tool_call", 1, null], ["pay-a", "tool_result", null, "ok"], ["pay-b", "tool_result", null, "ok"],
    ]);
  });
});

describe("subscribe across a server restart", () => {
  it("no change lost or repeated while the server is down and written to through the file", async () => {
    const since = await db.lastChange();
    const ac = new AbortController();
    const seen: Change[] = [];
    let wake: () => void = () => undefined;
    const sub = (async () => {
      for await (const ch of db.subscribe(since, { signal: ac.signal })) {
        seen.push(ch);
        wake();
      }
    })();
    const until = (n: number) => new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`only ${seen.length} of ${n} changes after 60 s`)), 60_000);
      wake = () => { if (seen.length >= n) { clearTimeout(timer); resolve(); } };
      wake();
    });
    const s = db.scope("app", "restart");
    for (let i = 0; i < 3; i++) await s.put(`before${i}`, i);
    await until(3);
    await srv.stop();
    await py("s = db.scope('app', 'restart')\nfor i in range(3): s.put(f'down{i}', i)\n");
    await srv.start();
    for (let i = 0; i < 3; i++) await s.put(`after${i}`, i);
    await until(9);
    ac.abort();
    await sub;
    assert.deepEqual(seen.map((c) => c.key),
      ["before0", "before1", "before2", "down0", "down1", "down2", "after0", "after1", "after2"]);
    assert.deepEqual(seen.map((c) => c.seq), Array.from({ length: 9 }, (_, i) => since + 1 + i),
      "every seq once, in order");
  });
});
