/** subscribe's reconnections against fake servers: paced, thrown when the URL is wrong, resumed from the last id. */

import assert from "node:assert/strict";
import type { ServerResponse } from "node:http";
import { describe, it } from "node:test";

import { StorageError, connect } from "agentstate-db";
import { serve } from "./fake.js";

/** A stream answer: `text`, then the end. */
function stream(res: ServerResponse, text: string) {
  res.writeHead(200, { "content-type": "text/event-stream" });
  res.end(text);
}

/**
 * Iterate `db.subscribe` until `until(done)` resolves, then abort: the changes' seqs, or what it
 * threw. `done` aborts once the iteration has ended (so that `until` stops waiting).
 */
async function subscribeFor(url: string, since: number, until: (done: AbortSignal) => Promise<unknown>,
  onChange?: (seq: number) => void) {
  const ac = new AbortController();
  const ended = new AbortController();
  const seqs: number[] = [];
  const done = (async () => {
    for await (const ch of connect(url, { token: "t" }).subscribe(since, { signal: ac.signal })) {
      seqs.push(ch.seq);
      onChange?.(ch.seq);
    }
  })();
  const stop = until(ended.signal).then(() => ac.abort(), () => ac.abort());
  try {
    await done;
    return { seqs, error: null as unknown };
  } catch (e) {
    return { seqs, error: e };
  } finally {
    ended.abort();
    await stop;
  }
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const end = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", end);
      resolve();
    };
    const timer = setTimeout(end, ms);
    signal?.addEventListener("abort", end, { once: true });
  });
}
const change = (seq: number) => JSON.stringify({ seq, at: "2026-01-01T00:00:00.000000Z", topic: "kv", op: "put",
  kind: "app", scope_id: "a", key: "k", version: seq, start: null, count: null });

describe("subscribe's reconnections", () => {
  /**
   * The pauses between the openings of a stream that delivers nothing: each at least half of
   * 0, 100, 200, 400, 800 ms (the jitter's lower end). Timers never fire early, so this holds
   * however loaded the machine; with no pause the openings come within a millisecond or two.
   */
  async function assertPaced(answer: string) {
    const srv = await serve((_req, res) => stream(res, answer));
    const six = async (done: AbortSignal) => {
      const deadline = Date.now() + 60_000;
      while (srv.seen.length < 6 && Date.now() < deadline && !done.aborted) await sleep(20, done);
    };
    const r = await subscribeFor(srv.url, 0, six);
    assert.equal(r.error, null);
    const at = srv.seen.map((q) => q.at);
    assert.ok(at.length >= 6, `${at.length} openings in 60 s`);
    const gaps = at.slice(1, 6).map((t, i) => t - at[i]!);
    const least = [0, 50, 100, 200, 400];
    assert.ok(gaps.every((g, i) => g >= least[i]! - 2), `pauses ${gaps.map((g) => g.toFixed(1)).join(", ")} ms`);
  }

  it("a stream that opens and ends at once is reopened after growing pauses, not in a tight loop", async () => {
    await assertPaced(": agentstate change stream\n\n");
  });

  it("a store that ends each stream with a busy error event is retried after growing pauses too", async () => {
    await assertPaced('event: error\ndata: {"error":{"code":"busy","message":"the store is busy"}}\n\n');
  });

  for (const [status, page] of [[404, "<h1>Not Found</h1>"], [403, "<h1>Forbidden by the proxy</h1>"],
    [400, "bad request"]] as const) {
    it(`a ${status} that is not an agentstate answer (a wrong URL, a proxy) is thrown, not retried`, async () => {
      const srv = await serve((_req, res) => {
        res.writeHead(status, { "content-type": "text/html" });
        res.end(page);
      });
      const r = await subscribeFor(srv.url, 0, (done) => sleep(10_000, done));
      assert.ok(r.error instanceof StorageError, `thrown: ${String(r.error)}`);
      assert.match(r.error.message, new RegExp(String(status)));
      assert.equal(srv.seen.length, 1);
    });
  }

  it("a gateway's 502 is retried, and the stream goes on from its cursor", async () => {
    let n = 0;
    const srv = await serve((_req, res) => {
      n++;
      if (n <= 2) {
        res.writeHead(502, { "content-type": "text/html" });
        res.end("<h1>Bad Gateway</h1>");
      } else {
        stream(res, `id: 5\ndata: ${change(5)}\n\n`);
      }
    });
    let got: () => void = () => undefined;
    const delivered = new Promise<void>((resolve) => { got = resolve; });
    const r = await subscribeFor(srv.url, 4, (done) => Promise.race([delivered, sleep(30_000, done)]), () => got());
    assert.equal(r.error, null);
    assert.deepEqual(r.seqs, [5]);
    assert.deepEqual(srv.seen.slice(0, 3).map((q) => new URL(q.url, "http://h").searchParams.get("since")), ["4", "4", "4"]);
  });

  it("reopens from the last id the server sent, even an id-only event past changes the filters left out", async () => {
    const answers = [`id: 7\ndata: ${change(7)}\n\n`, "id: 40\n\n", `id: 41\ndata: ${change(41)}\n\n`];
    const srv = await serve((_req, res) => stream(res, answers.shift() ?? ""));
    let got: () => void = () => undefined;
    const both = new Promise<void>((resolve) => { got = resolve; });
    const r = await subscribeFor(srv.url, 3, (done) => Promise.race([both, sleep(30_000, done)]),
      (seq) => { if (seq === 41) got(); });
    assert.equal(r.error, null);
    assert.deepEqual(r.seqs, [7, 41]);
    assert.deepEqual(srv.seen.slice(0, 3).map((q) => new URL(q.url, "http://h").searchParams.get("since")), ["3", "7", "40"]);
  });
});
