/**
 * A real `agentstate serve` for the tests: a temp database, tokens made with
 * the store's own command, a free loopback port; stopped at the end (and
 * killed if this process exits first, whatever the reason).
 *
 * The Python that runs it is $AGENTSTATE_PYTHON (tests/test_typescript.py
 * passes its own, with PYTHONPATH at the worktree), else `python3`.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before } from "node:test";

import { connect, type Database } from "agentstate-db";

export const PYTHON = process.env.AGENTSTATE_PYTHON || "python3";
const live = new Set<ChildProcess>();
process.on("exit", () => {
  for (const p of live) p.kill("SIGKILL");
});

/** Run Python code (argv after it: `args`); its stdout, or a rejection with its stderr. */
export function python(code: string, args: string[] = [], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn(PYTHON, ["-c", code, ...args], { stdio: ["pipe", "pipe", "pipe"] });
    live.add(p);
    let out = "";
    let err = "";
    p.stdout.on("data", (b: Buffer) => { out += b.toString(); });
    p.stderr.on("data", (b: Buffer) => { err += b.toString(); });
    p.on("error", reject);
    p.on("close", (code) => {
      live.delete(p);
      if (code === 0) resolve(out);
      else reject(new Error(`python exited ${code}: ${err}`));
    });
    p.stdin.end(input ?? "");
  });
}

/** Start a Python process that stays up (for races): its handle, with the process tracked. */
export function pythonProcess(code: string, args: string[] = []): ChildProcess {
  const p = spawn(PYTHON, ["-c", code, ...args], { stdio: ["pipe", "pipe", "pipe"] });
  live.add(p);
  p.on("close", () => live.delete(p));
  return p;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      s.close(() => (typeof a === "object" && a ? resolve(a.port) : reject(new Error("no port"))));
    });
  });
}

export class Served {
  url = "";
  private proc: ChildProcess | null = null;
  private log = "";

  constructor(readonly dir: string, readonly db: string, readonly token: string, readonly userToken: string,
    readonly port: number) {
    this.url = `http://127.0.0.1:${port}`;
  }

  /** Serve the database on this object's port; resolves once the server answers our token. */
  async start(): Promise<void> {
    const p = spawn(PYTHON, ["-m", "agentstate", "--db", this.db, "serve", "--port", String(this.port)], {
      stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, AGENTSTATE_DB: "" },
    });
    this.proc = p;
    live.add(p);
    this.log = "";
    p.stdout!.on("data", (b: Buffer) => { this.log += b.toString(); });
    p.stderr!.on("data", (b: Buffer) => { this.log += b.toString(); });
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      if (p.exitCode !== null) throw new Error(`agentstate serve exited ${p.exitCode}: ${this.log}`);
      try {
        const r = await fetch(this.url + "/v1/changes/head", { headers: { authorization: `Bearer ${this.token}` } });
        await r.arrayBuffer();
        if (r.status === 200) return; // ours: it knows our token
      } catch {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    await this.stop();
    throw new Error(`agentstate serve did not answer within 60 s: ${this.log}`);
  }

  /** Stop the server (Ctrl-C, then a kill after 15 s); resolves once it has exited. */
  async stop(): Promise<void> {
    const p = this.proc;
    this.proc = null;
    if (p === null || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => p.once("exit", () => resolve()));
    p.kill("SIGINT");
    const timer = setTimeout(() => p.kill("SIGKILL"), 15_000);
    await exited;
    clearTimeout(timer);
    live.delete(p);
  }

  /** Stop the server and remove its folder. */
  async close(): Promise<void> {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A new store with an admin token and a plain user's ("bob"), served on a free port. */
/** A scope (or run) id no other test of this process uses. */
let made = 0;
export const fresh = (prefix = "t"): string => `${prefix}-${++made}`;

/** A server for the tests of one file and a client of it, handed to `use` once up: started
 * before the file's tests, stopped after them. */
export function served(use: (srv: Served, db: Database) => void): void {
  let srv: Served | undefined;
  before(async () => {
    srv = await serve();
    use(srv, connect(srv.url, { token: srv.token }));
  });
  after(async () => {
    await srv?.close();
  });
}

export async function serve(): Promise<Served> {
  const dir = mkdtempSync(join(tmpdir(), "agentstate-ts-"));
  const db = join(dir, "store.db");
  const out = await python(
    "import sys, agentstate\n" +
    "db = agentstate.open(sys.argv[1])\n" +
    "print(db.tokens.create('ts-admin', admin=True)); print(db.tokens.create('bob')); db.close()", [db]);
  const [token, userToken] = out.trim().split("\n");
  const s = new Served(dir, db, token!, userToken!, await freePort());
  try {
    await s.start();
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  return s;
}

const WORKER = `
import sys, json, base64, traceback, agentstate
db = agentstate.open(sys.argv[1])
for line in sys.stdin:
    req = json.loads(line)
    ns = {"db": db, "inp": req["input"], "json": json, "base64": base64, "agentstate": agentstate}
    try:
        exec(req["code"], ns)
        print(json.dumps({"out": ns.get("out")}), flush=True)
    except Exception:
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
`;

/**
 * One Python process with the store's file open (not through the server), running snippets:
 * `db` and `inp` are given, `out` is answered (as JSON). One start instead of one per snippet.
 */
export class PyWorker {
  private readonly proc: ChildProcess;
  private buf = "";
  private readonly waiting: { resolve: (v: unknown) => void; reject: (e: Error) => void }[] = [];

  constructor(dbPath: string, private readonly parse: (text: string) => unknown = JSON.parse) {
    this.proc = pythonProcess(WORKER, [dbPath]);
    let err = "";
    this.proc.stderr!.on("data", (b: Buffer) => { err += b.toString(); });
    this.proc.stdout!.on("data", (b: Buffer) => {
      this.buf += b.toString();
      let i: number;
      while ((i = this.buf.indexOf("\n")) >= 0) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        const d = this.parse(line) as { out?: unknown; error?: string };
        const w = this.waiting.shift();
        if (d.error !== undefined) w?.reject(new Error(`python: ${d.error}`));
        else w?.resolve(d.out ?? null);
      }
    });
    this.proc.on("close", (code) => {
      for (const w of this.waiting.splice(0)) w.reject(new Error(`the Python worker exited ${code}: ${err}`));
    });
  }

  run(code: string, input: unknown = null): Promise<unknown> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.proc.stdin!.write(JSON.stringify({ code, input }) + "\n");
    });
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      if (this.proc.exitCode !== null) return resolve();
      this.proc.once("close", () => resolve());
      this.proc.stdin!.end();
    });
  }
}
