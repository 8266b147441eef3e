// agentstate pages: live updates over the change feed's server-sent events.
// Without this script every page still works; it only keeps them current.
// Data from the store is only ever put into the page as text (textContent) or
// as HTML the server rendered and escaped; never built into HTML here.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource || !window.fetch) return;
  var body = document.body;
  // data-watch: patterns "topic:kind:scope_id:key" ('' or missing parts match anything), or "*"
  var patterns = (body.getAttribute("data-watch") || "").split(" ").filter(Boolean);
  // data-since: the feed's newest seq when the server began reading this page: the stream
  // starts there, so a change made while the page was rendered or loading is not missed.
  var since = body.getAttribute("data-since") || "";
  var tail = document.getElementById("live-tail");

  // What the badge says: "live" only while the stream is open and the page is current.
  var streaming = false, stale = false, ended = null;
  function show() {
    var text, on = false;
    if (ended) text = ended;
    else if (!streaming) text = "reconnecting…";
    else if (stale) text = "not live: the page is out of date, retrying…";
    else { text = "live"; on = true; }
    live.textContent = text;
    live.className = on ? "live on" : "live off";
  }

  function matches(c) {
    return patterns.some(function (p) {
      if (p === "*") return true;
      var want = p.split(":"), got = [c.topic, c.kind, c.scope_id, c.key];
      for (var i = 0; i < want.length; i++) {
        if (want[i] !== "" && want[i] !== String(got[i])) return false;
      }
      return true;
    });
  }

  // Refreshing the page's content: one fetch at a time; a failed one is retried with a
  // growing pause (1 s doubling to 30 s), and the badge says the page is out of date.
  var timer = null, busy = false, again = false, backoff = 0;
  function refresh() {
    timer = null;
    if (busy) { again = true; return; }
    var active = document.activeElement;
    if (active && active.form) { timer = setTimeout(refresh, 1000); return; } // not while typing
    busy = true;
    fetch(location.href, {credentials: "same-origin", headers: {"accept": "text/html"}})
      .then(function (r) {
        if (r.redirected && r.url.indexOf("/ui/login") >= 0) { location.reload(); return null; }
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        if (html === null) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("content");
        var main = document.getElementById("content");
        if (!fresh || !main) throw new Error("not a page of ours");
        main.replaceChildren.apply(main, Array.from(fresh.childNodes));
        stale = false; backoff = 0;
      })
      .catch(function () {
        stale = true;
        backoff = Math.min(backoff ? backoff * 2 : 1000, 30000);
        again = true;
      })
      .then(function () {
        busy = false;
        show();
        if (again) { again = false; timer = setTimeout(refresh, stale ? backoff : 200); }
      });
  }
  function schedule() { if (!timer) timer = setTimeout(refresh, 200); }

  function link(href, text) {
    var a = document.createElement("a");
    a.href = href; a.textContent = text;
    return a;
  }
  function enc(s) { return encodeURIComponent(String(s)); }
  function addRow(c) {
    var rows = tail.querySelector("tbody");
    var tr = document.createElement("tr");
    tr.className = "new";
    var what;
    if (c.topic === "kv") what = link("/ui/scopes/" + enc(c.kind) + "/" + enc(c.scope_id) + "/keys/" + enc(c.key),
                                      c.kind + ":" + c.scope_id + " " + c.key);
    else if (c.topic === "run") what = link("/ui/runs/" + enc(c.scope_id), "run " + c.scope_id);
    else if (c.key) what = link("/ui/turns/" + enc(c.key), "turn " + c.key + " of " + c.scope_id);
    else what = document.createTextNode("session " + c.scope_id);
    // the store as of this change (SPEC §17): the scope and the key right after it
    var then = document.createElement("span");
    if (c.topic === "kv") {
      var scope = "/ui/scopes/" + enc(c.kind) + "/" + enc(c.scope_id);
      then.appendChild(link(scope + "?as_of=" + enc(c.seq), "scope"));
      then.appendChild(document.createTextNode(" "));
      then.appendChild(link(scope + "/keys/" + enc(c.key) + "?as_of=" + enc(c.seq), "key"));
    }
    [String(c.seq), c.at.replace("T", " ").slice(0, 19) + " UTC", c.topic, c.op, what,
     c.version === null ? "" : String(c.version), then].forEach(function (v) {
      var td = document.createElement("td");
      if (typeof v === "string") td.textContent = v; else td.appendChild(v);
      tr.appendChild(td);
    });
    rows.insertBefore(tr, rows.firstChild);
    while (rows.children.length > 200) rows.removeChild(rows.lastChild);  // the page stays small
  }

  var after = tail ? Number(tail.getAttribute("data-after")) : 0;
  var es = null;
  function connect() {
    // The browser itself reconnects with Last-Event-ID once an event has come; until then
    // this URL's since holds.
    es = new EventSource("/ui/stream" + (since ? "?since=" + enc(since) : ""));
    es.onopen = function () { streaming = true; show(); };
    es.onerror = function () { streaming = false; show(); };
    es.onmessage = function (ev) {
      var c = JSON.parse(ev.data);
      if (tail && c.seq > after) { addRow(c); after = c.seq; }
      if (matches(c)) schedule();
    };
    es.addEventListener("resync", function () { schedule(); });
    es.addEventListener("signedout", function () {
      es.close(); es = null; ended = "signed out: reload to sign in again"; show();
    });
  }
  live.textContent = "connecting…";
  connect();
  // A page left for another stays in the back-forward cache: close its stream, or the
  // browser's few connections per server fill up with streams of pages nobody sees.
  window.addEventListener("pagehide", function () { if (es) { es.close(); es = null; streaming = false; } });
  window.addEventListener("pageshow", function (ev) {
    if (ev.persisted && !es && !ended) { connect(); schedule(); }
  });
})();
