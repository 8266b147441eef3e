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

import { CallInProgress, connect, type Change, type Database, type JsonValue } from "agentstate";
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
    assert.equal(await s.update<bigint>("n", (v) => v + 1n), 1152921504606846978n);
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
