/**
 * The package as a user gets it: `npm pack` makes a tarball that installs in
 * a new Node project and imports as `import { connect } from "agentstate-db"`,
 * types included; and the README's example type-checks and runs.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import { connect } from "agentstate-db";
import { serve, type Served } from "./server.js";

const PKG = join(dirname(fileURLToPath(import.meta.url)), "..", ".."); // build/test -> the package
const TSC = join(PKG, "node_modules", "typescript", "bin", "tsc");
let srv: Served;
let tmp: string;

before(async () => {
  srv = await serve();
  tmp = mkdtempSync(join(tmpdir(), "agentstate-ts-pkg-"));
});
after(async () => {
  await srv?.close();
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

function run(cmd: string, args: string[], cwd: string, env: Record<string, string> = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { cwd, env: { ...process.env, ...env }, timeout: 120_000, maxBuffer: 1 << 24 },
      (err, stdout, stderr) => (err ? reject(new Error(`${cmd} ${args.join(" ")}: ${err.message}\n${stdout}\n${stderr}`))
        : resolve(stdout)));
  });
}

const NPM = process.platform === "win32" ? "npm.cmd" : "npm";
const QUIET = ["--no-audit", "--no-fund", "--loglevel=error"];

describe("the packed tarball", () => {
  it("installs in a new project without other packages, and imports and types as documented", async () => {
    const out = JSON.parse(await run(NPM, ["pack", "--json", "--pack-destination", tmp, ...QUIET], PKG)) as
      { filename: string; files: { path: string }[] }[];
    const files = out[0]!.files.map((f) => f.path).sort();
    assert.ok(files.includes("dist/index.js") && files.includes("dist/index.d.ts"), files.join(" "));
    assert.ok(files.every((f) => /^(dist\/|package\.json$|README\.md$)/.test(f)), `only what a user needs: ${files.join(" ")}`);
    const manifest = JSON.parse(readFileSync(join(PKG, "package.json"), "utf8")) as Record<string, unknown>;
    assert.equal(manifest.dependencies, undefined, "no runtime dependencies");

    const project = join(tmp, "user-project");
    mkdirSync(project);
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "user-project", private: true, type: "module" }));
    await run(NPM, ["install", "--offline", ...QUIET, join(tmp, out[0]!.filename)], project);
    assert.deepEqual(readdirSync(join(project, "node_modules")).filter((d) => !d.startsWith(".")), ["agentstate-db"]);

    writeFileSync(join(project, "main.mjs"), `
      import { connect, VersionConflict, NOT_RUN } from "agentstate-db";
      const db = connect(process.env.URL, { token: process.env.TOKEN });
      const s = db.scope("app", "packed");
      await s.put("k", 1, { ifVersion: 0 });
      const err = await s.put("k", 2, { ifVersion: 0 }).catch((e) => e);
      if (!(err instanceof VersionConflict) || err.currentVersion !== 1) throw new Error("not a VersionConflict: " + err);
      console.log(JSON.stringify(await s.getVersioned("k")), typeof NOT_RUN);
    `);
    const printed = await run(process.execPath, ["main.mjs"], project, { URL: srv.url, TOKEN: srv.token });
    assert.equal(printed.trim(), '{"value":1,"version":1} symbol');

    // A TypeScript user with the DOM's types and no Node types: the shipped .d.ts suffice.
    writeFileSync(join(project, "use.ts"), `
      import { connect, type Versioned, type Change } from "agentstate-db";
      export async function f(url: string, token: string): Promise<number> {
        const db = connect(url, { token });
        const v: Versioned<number> = await db.scope("agent", "a").getVersioned<number>("n");
        const n: number = await db.scope("agent", "a").update<number>("n", (x) => x + 1, { default: 0 });
        for await (const ch of db.subscribe(0)) { const c: Change = ch; return c.seq + n; }
        return (v.value ?? 0) + n;
      }
    `);
    await run(process.execPath, [TSC, "--noEmit", "--strict", "--module", "nodenext", "--target", "es2022",
      "--lib", "es2022,dom,dom.asynciterable", "--types", "", "use.ts"], project);
  });
});

describe("the types", () => {
  /** tsc --strict on `code` (a module importing the package, inside it): its output, and whether it passed. */
  async function tsc(name: string, code: string): Promise<{ ok: boolean; out: string }> {
    const dir = join(PKG, "build", "types", name); // inside the package: "agentstate-db" resolves to itself
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "use.ts"), code);
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({
      compilerOptions: { strict: true, noEmit: true, module: "nodenext", target: "es2022",
        lib: ["es2022", "dom", "dom.asynciterable"], types: [] },
      files: ["use.ts"] }));
    return run(process.execPath, [TSC, "-p", dir], PKG)
      .then((out) => ({ ok: true, out }), (e: Error) => ({ ok: false, out: e.message }));
  }
  const HEAD = 'import { connect } from "agentstate-db";\nconst s = connect("http://h", { token: "t" }).scope("app", "a");\n';

  it("update() without a default gives fn T | undefined: tsc --strict refuses code that would throw", async () => {
    const bad = await tsc("update-bad", HEAD + 'export const n = s.update<number>("n", (n) => n + 1);\n');
    assert.equal(bad.ok, false, "n + 1 on a number | undefined");
    assert.match(bad.out, /'n' is possibly 'undefined'/);
    const good = await tsc("update-good", HEAD +
      'export const a: Promise<number> = s.update<number>("n", (n) => (n ?? 0) + 1);\n' +
      'export const b: Promise<number> = s.update<number>("n", (n) => n + 1, { default: 0 });\n' +
      'export const c: Promise<number> = s.update<number>("n", async (n) => n + 1, { default: 0, fence: "t-1" });\n' +
      'export const d = s.update<string>("k", (v) => (v === undefined ? "absent" : v + "!"));\n');
    assert.equal(good.ok, true, good.out);
  });
});

describe("the README", () => {
  /** The ```ts block under the heading `## {heading}`, type-checked and run against the server; what it printed. */
  async function runExample(heading: string, name: string): Promise<string> {
    const readme = readFileSync(join(PKG, "README.md"), "utf8");
    const example = new RegExp(`## ${heading}\\n[\\s\\S]*?\`\`\`ts\\n([\\s\\S]*?)\`\`\``).exec(readme)?.[1];
    assert.ok(example, `the README has a \`\`\`ts block under ## ${heading}`);
    const dir = join(PKG, "build", "readme", name); // inside the package: "agentstate-db" resolves to itself
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "example.ts"), example);
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({
      compilerOptions: { strict: true, module: "nodenext", target: "es2022", lib: ["es2022"], types: ["node"],
        typeRoots: [join(PKG, "node_modules", "@types")], rootDir: ".", outDir: "." },
      files: ["example.ts"] }));
    await run(process.execPath, [TSC, "-p", dir], PKG);
    return run(process.execPath, [join(dir, "example.js")], PKG,
      { AGENTSTATE_URL: srv.url, AGENTSTATE_TOKEN: srv.token });
  }

  it("its example type-checks and runs against a server", async () => {
    const printed = await runExample("Example", "example");
    assert.equal(printed, "history has 1 items; visit 1\n{ value: undefined, version: 0 }\n" +
      "written first by someone else: version 1\n");
    const db = connect(srv.url, { token: srv.token });
    assert.deepEqual(await db.scope("session", "s-42").slice("history"), [{ role: "user", content: "hi" }]);
    assert.equal(await db.scope("agent", "support-bot").get("visits"), 1);
  });

  it("its example of reads in one call type-checks and runs against a server", async () => {
    const printed = await runExample("Reads in one call", "reads");
    assert.equal(printed, "{ value: 'Asia/Tokyo', version: 2 } { value: undefined, version: 0 }\n" +
      "tz Asia/Tokyo 2\n2 []\ntrue true\n[ '{\"seq\":0,\"type\":\"note\",\"text\":\"kept\"}' ]\n");
  });

  it("its example of reading the past type-checks and runs against a server", async () => {
    assert.equal(await runExample("Reading the past", "past"), "{ theme: 'dark' }\n" +
      "2 put { theme: 'light' }\n1 put { theme: 'dark' }\n" +
      "settings { theme: 'dark' } -> { theme: 'light' }\n1 { theme: 'dark' }\n1\n");
  });

  it("its example of following the feed type-checks and runs against a server", async () => {
    assert.equal(await runExample("Following the feed", "feed"), "1 append history 0 1\n");
  });

  it("every ts block of it is one that these tests run", () => {
    const readme = readFileSync(join(PKG, "README.md"), "utf8");
    const run = ["Example", "Reads in one call", "Reading the past", "Following the feed",
      "Fenced writes and calls that run once"];
    const blocks = [...readme.matchAll(/^ *```ts$/gm)].map((m) => {
      const headings = [...readme.slice(0, m.index).matchAll(/^## (.*)$/gm)];
      return headings[headings.length - 1]?.[1];
    });
    assert.deepEqual(blocks.sort(), [...run].sort(), "one ts block under each heading the tests run, no other");
  });

  it("its example of fenced writes and once type-checks and runs against a server", async () => {
    const printed = await runExample("Fenced writes and calls that run once", "once");
    assert.equal(printed, "{ refunded: 2500 } { refunded: 2500 } 1\n" +
      "not written: turn of this worker has ended\n");
    const db = connect(srv.url, { token: srv.token });
    const entries = await db.runs.entries("order-1001");
    assert.deepEqual(entries.map((e) => [e.type, e.call_id, e.tool ?? e.result]),
      [["tool_call", "refund-1001", "refund"], ["tool_result", "refund-1001", { refunded: 2500 }]]);
  });
});
