/* The console's live tables, fed by the websocket's requests message (docs/api.md, "Requests"):
   the requests in flight with their phase and, for staff, a cancel button; the activity table of
   recent traces, filterable, each row opening its trace (trace.js). Nothing here polls: the older
   traces are read once as the page opens (GET /api/requests), then every change comes live.
   In a fleet, the other hosts' requests come in their records (fleet and fleet.host messages) and
   join both tables, each row naming its host; only this host's own rows can be cancelled here. */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("dashboard-config").textContent);
  const $ = (id) => document.getElementById(id);
  const T = window.omlxTrace;
  const KEPT = 500;
  const FLEET = !!cfg.fleet;
  const HERE = cfg.host || "";
  let ui = null;                         // helpers from dashboard.js (init)
  const traces = new Map();              // id -> normalized trace, finished ones
  let inflight = [];
  const elsewhere = new Map();           // id -> normalized trace of another host, finished ones
  const running = new Map();             // another host -> {rows: its in-flight traces, seenAt}
  let staleMs = 4000;                    // a host silent this long has left (the fleet message says)
  let opened = null;                     // the id whose trace is open
  const listeners = [];

  const fmt = {
    bytes: (n) => (n == null ? "–" : ui.fmtBytes(n)),
    seconds: (s) => (s == null ? "–" : s < 1 ? Math.round(s * 1000) + " ms" : s.toFixed(s < 10 ? 2 : 1) + " s"),
  };

  function csrf() {
    const m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : cfg.csrf_token || "";
  }

  function onMessage(msg) {
    if (!msg) return;
    if (msg.type === "requests") {
      if (Array.isArray(msg.in_flight)) inflight = msg.in_flight.map(T.norm);
      if (Array.isArray(msg.recent)) keep(msg.recent);
    } else if (FLEET && msg.type === "fleet") {
      onFleet(msg);
    } else if (FLEET && msg.type === "fleet.host" && msg.record) {
      onRecord(msg.record.host, msg.record.requests, performance.now());
    } else {
      return;
    }
    render();
    for (const fn of listeners) fn({ inflight, traces });
  }

  function keep(list) {
    for (const raw of list) {
      const t = T.norm(raw);
      if (t.id) traces.set(t.id, t);
    }
    trim(traces);
  }

  function trim(map) {
    if (map.size <= KEPT) return;     // the oldest go
    const ids = [...map.values()].sort((a, b) => (a.started || 0) - (b.started || 0)).map((t) => t.id);
    for (const id of ids.slice(0, map.size - KEPT)) map.delete(id);
  }

  // ---- the other hosts of a fleet ------------------------------------------------------------

  function onFleet(msg) {
    if (msg.stale_seconds > 0) staleMs = msg.stale_seconds * 1000;
    const now = performance.now();
    const live = new Set((msg.hosts || []).map((h) => h.host));
    for (const host of [...running.keys()]) if (!live.has(host)) running.delete(host);
    for (const h of msg.hosts || []) onRecord(h.host, h.requests, now - (h.age_seconds || 0) * 1000);
  }

  // A record's requests (docs/api.md, "Requests"): its in-flight ones replace the last, its finished
  // ones are kept like this host's, so they outlive the few each record carries.
  function onRecord(host, requests, seenAt) {
    if (typeof host !== "string" || host === HERE || !requests) return;
    const rows = (list) => (Array.isArray(list) ? list : [])
      .map((raw) => T.norm(raw.host ? raw : Object.assign({}, raw, { host })));
    const known = running.get(host);
    if (known && known.seenAt > seenAt) return;     // older than the one shown
    for (const t of rows(requests.recent)) if (t.id && !traces.has(t.id)) elsewhere.set(t.id, t);
    trim(elsewhere);
    running.set(host, { rows: rows(requests.in_flight), seenAt });
  }

  const own = (t) => !FLEET || !t.host || t.host === HERE;
  const lookup = (id) => traces.get(id) || elsewhere.get(id);

  function allInflight() {
    if (!running.size) return inflight;
    const now = performance.now();
    const rows = [...inflight];
    for (const h of running.values()) {
      if (now - h.seenAt <= staleMs) rows.push(...h.rows.filter((t) => !elsewhere.has(t.id)));
    }
    return rows.sort((a, b) => (a.started || 0) - (b.started || 0));
  }

  // What the websocket does not send on connect: the traces running and finished before it opened
  // (docs/api.md, "Requests"), read once each time it (re)connects; every later change comes live.
  async function catchUp() {
    const get = (url) => fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : null)).catch(() => null);
    const [live, recent] = await Promise.all([get(cfg.requests_url + "/live"), get(cfg.requests_url + "?limit=200")]);
    if (recent) keep(recent.data || []);
    if (live) inflight = (Array.isArray(live) ? live : live.data || live.in_flight || []).map(T.norm);
    render();
    for (const fn of listeners) fn({ inflight, traces });
  }

  function render() {
    renderInflight();
    renderActivity();
  }

  // ---- in flight ---------------------------------------------------------------------------

  function cell(tr, label, text, cls) {
    const td = document.createElement("td");
    td.dataset.label = label;
    if (cls) td.className = cls;
    if (text != null) td.textContent = text;
    tr.appendChild(td);
    return td;
  }

  function renderInflight() {
    const body = document.querySelector("#inflight tbody");
    body.textContent = "";
    const now = Date.now() / 1000;
    const rows = allInflight();
    for (const t of rows) {
      const tr = document.createElement("tr");
      tr.dataset.id = t.id;
      tr.dataset.phase = t.phase || "";
      tr.dataset.host = t.host;
      cell(tr, "request", t.id, "mono");
      if (FLEET) cell(tr, "host", t.host || "–", "host");
      cell(tr, "model", t.model);
      const phase = cell(tr, "phase");
      const badge = document.createElement("span");
      badge.className = "badge phase phase-" + (t.phase || "running");
      badge.textContent = t.phase || "running";
      phase.appendChild(badge);
      if (t.phase === "prefilling" && t.prefillTotal) phase.append(" " + Math.round((100 * t.prefillDone) / t.prefillTotal) + "%");
      cell(tr, "for", t.started != null ? fmt.seconds(Math.max(0, now - t.started)) : "–", "num");
      // counted at the end: while it runs, the prompt's size once known
      cell(tr, "tokens", t.completion ? t.prompt + " → " + t.completion : (t.prefillTotal || "–") + " → …", "num");
      cell(tr, "KV", fmt.bytes(t.kv), "num");
      const act = cell(tr, "");
      if (cfg.can_cancel && own(t)) {      // another host's request is cancelled on its own page
        const b = document.createElement("button");
        b.type = "button";
        b.className = "cancel danger";
        b.textContent = "cancel";
        b.dataset.id = t.id;
        act.appendChild(b);
      }
      body.appendChild(tr);
    }
    $("inflight-empty").hidden = rows.length > 0;
    $("inflight-count").textContent = rows.length ? rows.length + " running" : "";
  }

  document.querySelector("#inflight tbody").addEventListener("click", async (ev) => {
    const b = ev.target.closest("button.cancel");
    if (!b) return;
    b.disabled = true;
    b.textContent = "cancelling…";
    try {
      const r = await fetch(cfg.requests_url + "/" + encodeURIComponent(b.dataset.id) + "/cancel", {
        method: "POST", credentials: "same-origin", body: "{}",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf(), Accept: "application/json" },
      });
      if (!r.ok) {
        const body = await r.json().catch(() => ({}));
        ui.toast("Cancel refused: " + (((body.error || {}).message) || "HTTP " + r.status), "error");
        b.disabled = false;
        b.textContent = "cancel";
      }
    } catch (e) {
      ui.toast("Cancel failed: " + e, "error");
    }
  });

  // ---- activity ----------------------------------------------------------------------------

  const filters = $("activity-filters");
  filters.addEventListener("input", () => renderActivity());
  filters.addEventListener("submit", (ev) => ev.preventDefault());

  const outcome = (t) => t.status;      // ok, error, cancelled (trace.js)

  function matches(t, f) {
    if (f.model && t.model !== f.model) return false;
    if (f.status && outcome(t) !== f.status) return false;
    if (f.q) {
      const hay = [t.id, t.model, t.host, t.route, t.status, t.error, t.key].join(" ").toLowerCase();
      if (!hay.includes(f.q.toLowerCase())) return false;
    }
    return true;
  }

  function syncModelOptions() {
    const select = filters.elements.model;
    const have = new Set([...select.options].map((o) => o.value));
    for (const t of [...traces.values(), ...elsewhere.values()]) {
      if (t.model && !have.has(t.model)) {
        select.add(new Option(t.model, t.model));
        have.add(t.model);
      }
    }
  }

  let shownKey = null;          // what the table shows: rebuilt only when the traces or the filter change
  const SHOWN = 200;

  function renderActivity() {
    const f = { model: filters.elements.model.value, status: filters.elements.status.value, q: filters.elements.q.value.trim() };
    const key = JSON.stringify([f, opened, [...traces.keys()], [...elsewhere.keys()]]);
    if (key === shownKey) return;
    shownKey = key;
    syncModelOptions();
    const all = [...traces.values(), ...elsewhere.values()].sort((a, b) => (b.started || 0) - (a.started || 0));
    const shown = all.filter((t) => matches(t, f));
    const body = document.querySelector("#activity tbody");
    body.textContent = "";
    for (const t of shown.slice(0, SHOWN)) {
      const tr = document.createElement("tr");
      tr.dataset.id = t.id;
      tr.dataset.model = t.model;
      tr.dataset.outcome = outcome(t);
      tr.dataset.host = t.host;
      tr.tabIndex = 0;
      tr.classList.toggle("open", t.id === opened);
      cell(tr, "time", t.started != null ? ui.fmtClock(t.started) : "–");
      cell(tr, "request", t.id, "mono");
      if (FLEET) cell(tr, "host", t.host || "–", "host");
      cell(tr, "model", t.model);
      cell(tr, "route", t.route, "muted small");
      const o = cell(tr, "outcome");
      const badge = document.createElement("span");
      badge.className = "badge outcome outcome-" + outcome(t);
      badge.textContent = t.status === "ok" ? "ok" : t.status + (t.raw.error ? " · " + t.raw.error : "");
      if (t.error) badge.title = t.error;
      o.appendChild(badge);
      cell(tr, "tokens", (t.prompt ?? "–") + (t.cached ? " (" + t.cached + ")" : "") + " · " + (t.completion ?? "–"), "num tokens");
      cell(tr, "waited", fmt.seconds(t.waited), "num");
      cell(tr, "TTFT", fmt.seconds(t.ttft), "num ttft");
      cell(tr, "tok/s", t.tps != null ? t.tps.toFixed(1) : "–", "num tps");
      cell(tr, "total", fmt.seconds(t.total), "num total");
      cell(tr, "KV", fmt.bytes(t.kv), "num");
      body.appendChild(tr);
    }
    $("activity-empty").hidden = shown.length > 0;
    $("activity-empty").textContent = all.length ? "No request matches the filter." : "No requests yet.";
    $("activity-count").textContent = all.length ? shown.length + " of " + all.length +
      (shown.length > SHOWN ? " (the newest " + SHOWN + " shown)" : "") : "";
    if (opened && lookup(opened)) showTrace(lookup(opened), false);
  }

  const activity = document.querySelector("#activity tbody");
  function openRow(ev) {
    const tr = ev.target.closest("tr[data-id]");
    if (!tr || (ev.type === "keydown" && ev.key !== "Enter")) return;
    const id = tr.dataset.id;
    if (opened === id) {
      opened = null;
      $("trace").hidden = true;
      renderActivity();
      return;
    }
    opened = id;
    renderActivity();
    showTrace(lookup(id), true);
  }
  activity.addEventListener("click", openRow);
  activity.addEventListener("keydown", openRow);

  async function showTrace(t, fetchWhole) {
    const box = $("trace");
    box.hidden = false;
    T.render(box, t, fmt);
    if (!fetchWhole || t.ended != null || !own(t)) return;
    try {            // a trace still running: its state now, once
      const r = await fetch(cfg.requests_url + "/" + encodeURIComponent(t.id),
                            { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!r.ok) return;
      const whole = T.norm(await r.json());
      traces.set(t.id, Object.assign(t, whole));
      if (opened === t.id) T.render(box, t, fmt);
    } catch (e) { /* the summary stays shown */ }
  }

  window.omlxConsole = {
    onMessage,
    init(helpers) { ui = helpers; render(); },
    onOpen: catchUp,
    onRequests(fn) { listeners.push(fn); },
    trace: lookup,           // this host's trace, or in a fleet another host's from its record
    traces() { return [...traces.values()]; },
    render: T.render,
    fmt,
    csrf,
    tick() { if (inflight.length || running.size) renderInflight(); },
  };
})();
