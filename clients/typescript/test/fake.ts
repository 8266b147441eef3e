/**
 * Small loopback HTTP servers that misbehave on purpose, for the transport's
 * tests (redirects, a stream that ends at once, a wrong URL's 404).
 */

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { after } from "node:test";

/** A request as the server got it; `at`: when its body had come (performance.now(), ms). */
export interface Seen { method: string; url: string; headers: IncomingMessage["headers"]; body: string; at: number }

/** A loopback server answering with `handle`; every request it got, in `seen`. */
export async function serve(handle: (req: IncomingMessage, res: ServerResponse, body: string) => void) {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (c: string) => { body += c; });
    req.on("end", () => {
      seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body, at: performance.now() });
      handle(req, res, body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const addr = server.address();
  if (typeof addr !== "object" || addr === null) throw new Error("no address");
  const stop = () => new Promise<void>((resolve) => {
    server.closeAllConnections();
    server.close(() => resolve());
  });
  after(stop);
  return { url: `http://127.0.0.1:${addr.port}`, seen, stop };
}

export const json = (res: ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
};

/** What a failed promise rejected with (fails the test if it resolved). */
export async function failure(p: Promise<unknown>): Promise<unknown> {
  return p.then((v) => assert.fail(`resolved with ${JSON.stringify(v)}`), (e: unknown) => e);
}
