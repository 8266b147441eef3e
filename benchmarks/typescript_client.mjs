// The TypeScript client's overhead beside plain fetch doing the same requests.
//
//     cd clients/typescript && npm ci && npm run build && cd ../..
//     PYTHONPATH=$PWD node benchmarks/typescript_client.mjs            # ~3 min, writes benchmarks/TYPESCRIPT.md
//     PYTHONPATH=$PWD node benchmarks/typescript_client.mjs --quick    # a smoke run, prints only
//
// One `agentstate serve` (durability full, a temp database, $AGENTSTATE_PYTHON or python3) on a
// free loopback port; this process is the load: N callers, each sending its next request as soon
// as the last is answered, over Node's fetch (keep-alive). Each workload runs the client and a
// hand-written plain-fetch version of the same requests, every caller alternating the two, over
// several rounds; the figure is the median over the rounds of (the client's median latency /
// plain fetch's median latency): 1.00 = no overhead, the target is at most 1.20. Alternating
// call by call keeps the two sides under the same load on a shared machine. Workloads: GET a key; PUT one of 100 keys; append to the
// caller's own list; update (a compare-and-set loop: GET, then PUT with if_version, again on a
// conflict) of one key shared by every caller, from one client (whose own updates of a key take
// turns) and from 16 clients. Then the client's own CPU per call on canned answers (no network),
// and its JSON reader and writer beside JSON.parse and JSON.stringify.

import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import os from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const DIST = join(HERE, "..", "clients", "typescript", "dist");
const { connect } = await import(join(DIST, "index.js"));
const { parse, encode } = await import(join(DIST, "json.js")); // internal: the reader and writer

const QUICK = process.argv.includes("--quick");
const ROUNDS = QUICK ? 2 : 9;
const OPS = QUICK ? { 1: 40, 16: 160 } : { 1: 200, 16: 640 }; // per side per round
const PYTHON = process.env.AGENTSTATE_PYTHON || "python3";
const started = Date.now();

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const fmt = (x, d = 2) => x.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });

async function freePort() {
  return new Promise((resolve) => { const s = createServer(); s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => resolve(p)); }); });
}

// -- the server --------------------------------------------------------------------------

const dir = mkdtempSync(join(os.tmpdir(), "agentstate-ts-bench-"));
const dbPath = join(dir, "bench.db");
const token = execFileSync(PYTHON, ["-m", "agentstate", "--db", dbPath, "tokens", "create", "bench", "--admin"]).toString().trim();
const port = await freePort();
const server = spawn(PYTHON, ["-m", "agentstate", "--db", dbPath, "serve", "--port", String(port)], { stdio: "ignore" });
process.on("exit", () => { server.kill("SIGKILL"); rmSync(dir, { recursive: true, force: true }); });
const URL_ = `http://127.0.0.1:${port}`;
for (let i = 0; ; i++) {
  try { const r = await fetch(`${URL_}/v1/changes/head`, { headers: { authorization: `Bearer ${token}` } }); await r.text(); if (r.ok) break; } catch { /* not yet */ }
  if (i > 600) throw new Error("the server did not start");
  await new Promise((r) => setTimeout(r, 100));
}

// -- the workloads: a client version and a plain-fetch version of each --------------------

const H = { authorization: `Bearer ${token}` };
const HJ = { ...H, "content-type": "application/json" };
const VALUE = { role: "assistant", content: "x".repeat(200), tokens: 57, tool_calls: [{ id: "c1", name: "search" }] };
const KEYS = `${URL_}/v1/scopes/agent/bench/keys`;

let requests = { client: 0, plain: 0 };
const counting = (side) => (u, i) => { requests[side]++; return fetch(u, i); };
const clientDb = connect(URL_, { token, fetch: counting("client") });
const clients16 = Array.from({ length: 16 }, () => connect(URL_, { token, fetch: counting("client") }));
const scope = clientDb.scope("agent", "bench");
await scope.put("k", VALUE);

async function plainCas(key) {
  for (;;) {
    requests.plain++;
    const r = await fetch(`${KEYS}/${key}`, { headers: H });
    const d = await r.json();
    const [value, version] = r.status === 404 ? [0, 0] : [d.value, d.version];
    requests.plain++;
    const w = await fetch(`${KEYS}/${key}`, { method: "PUT", headers: HJ, body: JSON.stringify({ value: value + 1, if_version: version, keep_ttl: true }) });
    await w.json();
    if (w.status === 200) return value + 1;
    if (w.status !== 409) throw new Error(`PUT ${w.status}`);
  }
}

const appended = new Map();
function listKey(side, w) {
  const n = (appended.get(side + w) ?? 0) + 1;
  appended.set(side + w, n);
  return `l${side}${w}-${n >> 9}`;
}

const WORKLOADS = {
  get: {
    client: async () => scope.get("k"),
    plain: async () => (await (await fetch(`${KEYS}/k`, { headers: H })).json()).value,
  },
  put: {
    client: async (w, i) => scope.put(`p${i % 100}`, VALUE),
    plain: async (w, i) => (await (await fetch(`${KEYS}/p${i % 100}`, { method: "PUT", headers: HJ, body: JSON.stringify({ value: VALUE }) })).json()).version,
  },
  append: { // each caller its own lists, a new one every 512 items (a list is at most 1 MiB)
    client: async (w) => scope.append(listKey("c", w), [VALUE]),
    plain: async (w) => (await (await fetch(`${KEYS}/${listKey("p", w)}/append`, { method: "POST", headers: HJ, body: JSON.stringify({ items: [VALUE] }) })).json()).length,
  },
  "update, one client": {
    client: async () => scope.update("counter-a", (n) => n + 1, { default: 0 }),
    plain: async () => plainCas("counter-p"),
    count: true,
    alone: true,
    ops16: QUICK ? 64 : 192, // every caller on one key: each update retries many times
  },
  "update, a client per caller": {
    client: async (w) => clients16[w % 16].scope("agent", "bench").update("counter-b", (n) => n + 1, { default: 0 }),
    plain: async () => plainCas("counter-q"),
    count: true,
    alone: true,
    ops16: QUICK ? 64 : 192,
  },
};

/**
 * One round: every caller alternates a client call and a plain-fetch call (who goes first varies
 * by caller and round), so both sides meet the same server, the same contention and the same
 * background load; the latency of each call is kept per side.
 */
async function round(wl, callers, perCaller, r) {
  if (wl.alone) return alone(wl, callers, perCaller, r);
  const lat = { client: [], plain: [] };
  await Promise.all(Array.from({ length: callers }, async (_, w) => {
    for (let i = 0; i < perCaller; i++) {
      const side = (i + w + r) % 2 ? "client" : "plain";
      const t0 = performance.now();
      await wl[side](w, i);
      lat[side].push(performance.now() - t0);
    }
  }));
  return lat;
}

/**
 * A round of a contended workload: each side alone (who goes first alternates by round), since
 * one side's retries would slow the other's; the figure per call is the wall time per completed
 * call (1 ÷ throughput), the same for each call of the side.
 */
async function alone(wl, callers, perCaller, r) {
  const lat = {};
  for (const side of r % 2 ? ["client", "plain"] : ["plain", "client"]) {
    const each = Math.ceil(perCaller / 2);
    const t0 = performance.now();
    await Promise.all(Array.from({ length: callers }, async (_, w) => { for (let i = 0; i < each; i++) await wl[side](w, i); }));
    lat[side] = Array(each * callers).fill((performance.now() - t0) / (each * callers));
  }
  return lat;
}

const rows = [];
for (const [name, wl] of Object.entries(WORKLOADS)) {
  for (const callers of [1, 16]) {
    if (name === "update, a client per caller" && callers === 1) continue; // the same as one client
    const perCaller = Math.ceil(2 * (callers === 16 && wl.ops16 ? wl.ops16 : OPS[callers]) / callers);
    await round(wl, callers, 4, 0); // warm up: connections, JIT
    requests = { client: 0, plain: 0 };
    const ratios = [], all = { client: [], plain: [] };
    for (let r = 0; r < ROUNDS; r++) {
      const lat = await round(wl, callers, perCaller, r);
      ratios.push(median(lat.client) / median(lat.plain));
      all.client.push(...lat.client); all.plain.push(...lat.plain);
    }
    rows.push({ name, callers, client: median(all.client), plain: median(all.plain), ratio: median(ratios),
      spread: [Math.min(...ratios), Math.max(...ratios)],
      reqs: wl.count ? [requests.client / all.client.length, requests.plain / all.plain.length] : null });
    console.error(`${name} x${callers}: ratio ${fmt(median(ratios))} (${fmt(Math.min(...ratios))}-${fmt(Math.max(...ratios))})`);
  }
}

// -- the client's own CPU, on canned answers (no network) ----------------------------------

const cannedGet = JSON.stringify({ key: "k", value: VALUE, version: 12 });
const canned = async () => new Response(cannedGet, { status: 200 });
const offline = connect("http://127.0.0.1:1", { token: "t", fetch: canned });
const offScope = offline.scope("agent", "bench");
async function perCall(fn, n) { const t0 = performance.now(); for (let i = 0; i < n; i++) await fn(); return ((performance.now() - t0) / n) * 1000; }
const CPU_ROUNDS = QUICK ? 5 : 31, CPU_N = 1000;
const cpu = { get: [], put: [] };
const plainCanned = { get: async () => (await (await canned(`${KEYS}/k`, { headers: H })).json()).value,
  put: async () => (await (await canned(`${KEYS}/k`, { method: "PUT", headers: HJ, body: JSON.stringify({ value: VALUE }) })).json()).version };
const clientCanned = { get: () => offScope.get("k"), put: () => offScope.put("k", VALUE) };
for (const op of ["get", "put"]) { await perCall(clientCanned[op], CPU_N); await perCall(plainCanned[op], CPU_N); }
for (let r = 0; r < CPU_ROUNDS; r++) {
  for (const op of ["get", "put"]) {
    let a, b;
    if (r % 2) { a = await perCall(clientCanned[op], CPU_N); b = await perCall(plainCanned[op], CPU_N); }
    else { b = await perCall(plainCanned[op], CPU_N); a = await perCall(clientCanned[op], CPU_N); }
    cpu[op].push([a, b]);
  }
}

// -- the JSON reader and writer -----------------------------------------------------------

function nsPer(fn, n) { const t0 = process.hrtime.bigint(); for (let i = 0; i < n; i++) fn(); return Number(process.hrtime.bigint() - t0) / n; }
/** ns per call of `a` and of `b`: medians of many short alternating batches. */
function pair(a, b, n) {
  nsPer(a, n); nsPer(b, n);
  const xs = [], ys = [];
  for (let r = 0; r < (QUICK ? 5 : 41); r++) { if (r % 2) { xs.push(nsPer(a, n)); ys.push(nsPer(b, n)); } else { ys.push(nsPer(b, n)); xs.push(nsPer(a, n)); } }
  return [median(xs), median(ys)];
}
const history = JSON.stringify({ items: Array.from({ length: 100 }, (_, i) => ({ ...VALUE, n: i })) });
const bigHistory = JSON.stringify({ items: Array.from({ length: 100 }, (_, i) => ({ ...VALUE, n: i, id: "12345678901234567890" })) }).replace(/"12345678901234567890"/g, "12345678901234567890");
const parsing = [
  ["a GET answer (one small value)", cannedGet, 2000],
  ["100 history items (28 KB)", history, 50],
  ["100 history items with a 64-bit integer each", bigHistory, 50],
].map(([what, text, n]) => [what, ...pair(() => parse(text), () => JSON.parse(text), n)]);
const histValue = JSON.parse(history);
const writing = [
  ["one small value", VALUE, 2000],
  ["100 history items", histValue, 50],
  ["100 items with a bigint each", { items: histValue.items.map((x) => ({ ...x, id: 2n ** 62n })) }, 50],
].map(([what, v, n], i) => [what, ...pair(() => encode(v), i < 2 ? () => JSON.stringify(v)
  : () => JSON.stringify(v, (k, x) => (typeof x === "bigint" ? Number(x) : x)), n)]);

// -- the report -------------------------------------------------------------------------------

server.kill("SIGINT");
const minutes = (Date.now() - started) / 60000;
const cpus = os.cpus();
const now = new Date().toISOString().slice(0, 16).replace("T", " ");
const py = execFileSync(PYTHON, ["-c", "import platform; print(platform.python_version())"]).toString().trim();
let md = `# The TypeScript client beside plain fetch

Generated by \`(cd clients/typescript && npm ci && npm run build) && node benchmarks/typescript_client.mjs\`
(agentstate with its \`server\` extra importable by \`$AGENTSTATE_PYTHON\`, else \`python3\`) on ${now} UTC in ${fmt(minutes, 1)} min; ` +
  `${cpus.length} cores (${cpus[0]?.model.trim()}; the server, the load and other work share them), ` +
  `Node ${process.version}, Python ${py}, load average at the end ${os.loadavg().map((x) => fmt(x)).join(" ")}. ` +
  `One \`agentstate serve\` at durability full on loopback; ${ROUNDS} rounds, each of ${OPS[1]} calls ` +
  `per side (1 caller) or ${OPS[16]} (16 callers; updates: ${WORKLOADS["update, one client"].ops16}), every caller ` +
  `alternating a client call and a plain-fetch call.

## Over HTTP

The latency of one call, median over all rounds, and the median over the rounds of (the
client's median ÷ plain fetch's median): 1.00× is no overhead. Updates (a compare-and-set loop
on one key that every caller shares) run each side alone in turn, since one side's retries
slow the other's: their figure is the wall time per completed update (1 ÷ throughput).

| workload | callers | client ms | plain fetch ms | client ÷ plain | rounds' range | within 20% |
|---|---|---|---|---|---|---|
`;
for (const r of rows) {
  md += `| ${r.name} | ${r.callers} | ${fmt(r.client)} | ${fmt(r.plain)} | ${fmt(r.ratio)}× | ${fmt(r.spread[0])}–${fmt(r.spread[1])} | ${r.ratio <= 1.2 ? "✅" : "❌"} |\n`;
}
const upd = rows.filter((r) => r.reqs);
md += `
Requests per update (the compare-and-set loop's retries): ${upd.map((r) => `${r.name} ×${r.callers}: client ${fmt(r.reqs[0])}, plain ${fmt(r.reqs[1])}`).join("; ")}.
The client's own updates of one key take turns, so with one client its 16 callers do not make
each other retry; with a client per caller it retries as the plain loop does.

## The client's own CPU per call (canned answers, no network)

| call | client µs | plain fetch + JSON µs | difference µs |
|---|---|---|---|
`;
for (const op of ["get", "put"]) {
  const a = median(cpu[op].map((x) => x[0])), b = median(cpu[op].map((x) => x[1]));
  md += `| ${op} | ${fmt(a, 1)} | ${fmt(b, 1)} | ${fmt(a - b, 1)} |\n`;
}
md += `
The difference is the client's own work per call: the key check, the URL from the route table,
the §2 walk of a value before \`JSON.stringify\`, its own reading of the answer, the error
classes — microseconds beside a request of about a millisecond.

## Reading and writing JSON

| reading | client's parse ns | JSON.parse ns | ratio |
|---|---|---|---|
`;
for (const [what, a, b] of parsing) md += `| ${what} | ${fmt(a, 0)} | ${fmt(b, 0)} | ${fmt(a / b)}× |\n`;
md += `
| writing | client's encode ns | JSON.stringify ns | ratio |
|---|---|---|---|
`;
for (const [what, a, b] of writing) md += `| ${what} | ${fmt(a, 0)} | ${fmt(b, 0)} | ${fmt(a / b)}× |\n`;
md += `
Text without a run of 16 digits (no integer that could be past 2^53) goes straight to
\`JSON.parse\`; the rest to the client's own parser, which keeps such integers as bigints.
Writing walks the value once for the checks, then uses \`JSON.stringify\` unless the value holds
a bigint or a float under 1e-4 (spelled as Python does); the JSON.stringify column of the bigint
row converts them with a replacer, which loses their precision.
`;
if (QUICK) console.log(md);
else { writeFileSync(join(HERE, "TYPESCRIPT.md"), md); console.log(md); }
process.exit(0);
