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
  var tail = document.getElementById("live-tail");

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

  var timer = null, busy = false, again = false;
  function refresh() {
    timer = null;
    if (busy) { again = true; return; }
    var active = document.activeElement;
    if (active && active.form) { again = true; timer = setTimeout(refresh, 1000); return; } // not while typing
    busy = true;
    fetch(location.href, {credentials: "same-origin", headers: {"accept": "text/html"}})
      .then(function (r) {
        if (r.redirected && r.url.indexOf("/ui/login") >= 0) { location.reload(); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html === null) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("content");
        var main = document.getElementById("content");
        if (fresh && main) main.replaceChildren.apply(main, Array.from(fresh.childNodes));
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) { again = false; schedule(); }
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
    [String(c.seq), c.at.replace("T", " ").slice(0, 19) + " UTC", c.topic, c.op, what,
     c.version === null ? "" : String(c.version)].forEach(function (v) {
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
    es = new EventSource("/ui/stream");
    es.onopen = function () { live.textContent = "live"; live.className = "live on"; };
    es.onerror = function () { live.textContent = "reconnecting…"; live.className = "live off"; };
    es.onmessage = function (ev) {
      var c = JSON.parse(ev.data);
      if (tail && c.seq > after) { addRow(c); after = c.seq; }
      if (matches(c)) schedule();
    };
    es.addEventListener("resync", function () { schedule(); });
  }
  connect();
  // A page left for another stays in the back-forward cache: close its stream, or the
  // browser's few connections per server fill up with streams of pages nobody sees.
  window.addEventListener("pagehide", function () { if (es) { es.close(); es = null; } });
  window.addEventListener("pageshow", function (ev) { if (ev.persisted && !es) { connect(); schedule(); } });
})();
