/** The token and the URL's credentials are never sent where they break a request, nor shown in an error. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { InvalidValue, StorageError, Unauthorized, UsageError, connect } from "agentstate-db";
import { Http } from "#internal/http.js";
import { ROUTES } from "#internal/wire.js";
import { failure } from "./fake.js";

describe("the token and the URL", () => {
  it("connect refuses a token that cannot be sent in a header, without showing it", () => {
    for (const token of ["secretAAA\nBBB", "sec ret\r\nX-Evil: 1", "secretAAA\u00e9BBB", "secretAAA\u0001BBB",
      "secretAAA BBB", "secretAAA\tBBB", "secretAAA\u007fBBB"]) {
      const e = (() => { try { connect("http://127.0.0.1:1", { token }); } catch (x) { return x; } return null; })();
      assert.ok(e instanceof Unauthorized, `${JSON.stringify(token)}: ${String(e)}`);
      assert.ok(!e.message.includes("secretAAA") && !e.message.includes("BBB"), e.message);
    }
    assert.doesNotThrow(() => connect("http://h", { token: "  Ab0-._~+/=  " }), "visible ASCII, trimmed");
  });

  it("connect refuses a URL with credentials, a query or a fragment, without showing its password", () => {
    for (const url of ["http://user:pass1234@127.0.0.1:1", "https://:pass1234@h", "http://user@h/", "ftp://u:pass1234@h",
      "http://h/?x=pass1234", "http://h/#pass1234", "http://", "http://exa mple.com:pass1234"]) {
      const e = (() => { try { connect(url, { token: "t" }); } catch (x) { return x; } return null; })();
      assert.ok(e instanceof InvalidValue, `${url}: ${String(e)}`);
      assert.ok(!e.message.includes("pass1234"), e.message);
    }
    assert.equal(connect("https://h.example:8765/base/", { token: "t" }).url, "https://h.example:8765/base");
  });

  it("a request that cannot be built is not sent, not in doubt, and its error shows neither the token nor fetch's text", async () => {
    let sent = 0;
    const f = async (url: string, init?: RequestInit): Promise<Response> => {
      sent++;
      return fetch(url, init);
    };
    // Past connect's check (as by a future header): the transport's own guard.
    const http = new Http("http://127.0.0.1:1", "tok-SECRET\nX", undefined, f);
    const e = await failure(http.call(ROUTES.scope.put, { kind: "app", id: "a", key: "k" }, { json: "1" }));
    assert.ok(e instanceof UsageError, String(e));
    assert.ok(!e.message.includes("SECRET"), e.message);
    assert.equal(sent, 0);
  });

  it("a fetch that fails with the token in its text: the error does not repeat it", async () => {
    const leaky = async (_url: string, init?: RequestInit): Promise<Response> => {
      throw new TypeError(`bad header: ${new Headers(init?.headers).get("authorization")}`, {
        cause: new Error(`again ${new Headers(init?.headers).get("authorization")}`) });
    };
    const db = connect("http://127.0.0.1:1", { token: "tok-SECRET-2", fetch: leaky });
    const e = await failure(db.scope("app", "a").put("k", 1));
    assert.ok(e instanceof StorageError && e.outcomeUnknown === true, String(e));
    assert.ok(!e.message.includes("SECRET"), e.message);
  });
});
