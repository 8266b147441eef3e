/**
 * Error classes keep their names when a bundler minifies the client (esbuild --minify, which
 * is what Vite does for a page): `err.name === "VersionConflict"`, and that name is what a
 * failed turn or call records (SPEC §16).
 */

import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { before, describe, it } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

import { build } from "esbuild";
import type * as Client from "agentstate-db";

const PKG = join(dirname(fileURLToPath(import.meta.url)), "..", ".."); // build/test -> the package
let min: typeof Client;

before(async () => {
  const out = join(PKG, "build", "min", "agentstate-db.min.js");
  mkdirSync(dirname(out), { recursive: true });
  await build({ entryPoints: [join(PKG, "dist", "index.js")], bundle: true, minify: true, format: "esm",
    platform: "neutral", outfile: out, logLevel: "error" });
  min = (await import(pathToFileURL(out).href)) as typeof Client;
});

/** Every error class the package exports, by its exported name. */
function errorClasses(): [string, new (message: string) => Error][] {
  return Object.entries(min).filter(([, v]) => typeof v === "function" &&
    (v === min.AgentStateError || v.prototype instanceof min.AgentStateError)) as [string, new (m: string) => Error][];
}

/** A fetch answering in turn with each body of `answers` (JSON), recording the requests' bodies. */
function scripted(answers: [number, unknown][], bodies: string[]) {
  return async (_url: string, init?: RequestInit): Promise<Response> => {
    if (typeof init?.body === "string") bodies.push(init.body);
    const [status, body] = answers.shift() ?? [500, {}];
    return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
  };
}

const TURN = { id: "t-1", session_id: "s-1", n: 1, status: "running", input: null, request: null, decision: null,
  result: null, error: null, lease: 60, lease_until: 1, created_at: "2026-01-01T00:00:00.000000Z",
  updated_at: "2026-01-01T00:00:00.000000Z" };

describe("the client bundled with esbuild --minify", () => {
  it("has its classes renamed (what would take their names away)", () => {
    const renamed = errorClasses().filter(([name, cls]) => cls.name !== name);
    assert.ok(renamed.length >= 20, `renamed: ${renamed.map(([n, c]) => `${n} -> ${c.name}`).join(", ")}`);
  });

  it("every error class keeps its name, on its errors and in their text", () => {
    const classes = errorClasses();
    assert.equal(classes.length, 25);
    for (const [name, cls] of classes) {
      const e = new cls("the message");
      assert.equal(e.name, name);
      assert.equal(String(e), `${name}: the message`);
      assert.ok(e.stack?.startsWith(`${name}: the message`), e.stack);
    }
  });

  it("errors made from the server's answers have their names", async () => {
    const db = min.connect("http://x.invalid", { token: "t", fetch: scripted(
      [[409, { error: { code: "version_conflict", message: "v", current_version: 3 } }]], []) });
    const e = await db.scope("app", "a").put("k", 1, { ifVersion: 0 }).catch((x: unknown) => x);
    assert.ok(e instanceof min.VersionConflict);
    assert.equal(e.name, "VersionConflict");
    assert.equal(e.currentVersion, 3);
  });

  it("sessions.turn() and runs.once() record the error's real name", async () => {
    const bodies: string[] = [];
    const db = min.connect("http://x.invalid", { token: "t", fetch: scripted([
      [201, TURN], [200, TURN], [200, { ...TURN, status: "failed" }],
      [200, { status: "claimed", entry: { type: "tool_call" } }], [200, { entry: {} }]], bodies) });
    await assert.rejects(db.sessions.turn("s-1", () => { throw new min.VersionConflict("stale plan"); }), min.VersionConflict);
    await assert.rejects(db.runs.once("r", "c", () => { throw new min.LeaseLost("taken over"); }), min.LeaseLost);
    assert.deepEqual(bodies.filter((b) => b.includes("error")),
      ['{"error":"VersionConflict: stale plan"}', '{"error":"LeaseLost: taken over","retry":0}']);
  });
});
