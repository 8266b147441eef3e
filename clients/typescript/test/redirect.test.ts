/** Redirects are never followed (a write sent elsewhere, or turned into a GET, is not a write). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { StorageError, connect } from "agentstate-db";
import { failure, json, serve } from "./fake.js";

describe("redirects", () => {
  it("a redirect is never followed: a StorageError, the other origin gets nothing, a write is not in doubt", async () => {
    // What answers at the redirect's target: a plausible agentstate answer, to be taken for one.
    const other = await serve((_req, res) => json(res, 200, { version: 42, deleted: true, value: "evil" }));
    let code = 307;
    const front = await serve((req, res) => {
      res.writeHead(code, { location: other.url + (req.url ?? "/") });
      res.end();
    });
    const db = connect(front.url, { token: "tok-SECRET-1", principal: "alice" });
    const s = db.scope("app", "x", { fence: "turn-1" });
    for (code of [301, 302, 303, 307, 308]) {
      const calls: [string, () => Promise<unknown>][] = [
        ["put", () => s.put("k", { secret: "v" })], ["delete", () => s.delete("k")], ["get", () => s.get("k")],
      ];
      for (const [what, call] of calls) {
        const e = await failure(call());
        assert.ok(e instanceof StorageError, `${code} ${what}: ${String(e)}`);
        assert.equal(e.outcomeUnknown, false, `${code} ${what}: the server said "go elsewhere", it did not do it`);
        assert.match(e.message, new RegExp(`${code}`), "the message says what the server answered");
        assert.ok(!e.message.includes("SECRET"), e.message);
      }
    }
    assert.equal(other.seen.length, 0, `the redirect's target got ${JSON.stringify(other.seen.map((r) => r.method + " " + r.url))}`);
    assert.equal(front.seen.length, 15, "each call sent once, to the URL given to connect");
  });
});
