/* The dashboard's Fleet section (OMLX_REDIS_URL only; the page does not load this file otherwise).
   Every host publishes its whole record about once a second; the websocket brings the whole fleet on
   connect ({"type": "fleet"}) and each record as it comes ({"type": "fleet.host"}). Per host: a card
   with its memory, a small chart and its models, whose buttons act on that host. A host whose last
   record is older than `stale_seconds` has left the page. Loaded before dashboard.js, which calls
   init(), onMessage() and decorateRow(). */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("dashboard-config").textContent);
  const $ = (id) => document.getElementById(id);
  const HERE = cfg.host;
  const RESIDENT = ["loaded", "loading"];
  const CHART_SECONDS = 300;
  const EVENTS_SHOWN = 20;

  let ui = null;              // dashboard.js's helpers: send, toast, fmtBytes, ...
  let staleMs = 4000;
  let queued = false;
  const hosts = new Map();    // host id -> {record, seenAt, card, plot, data}

  // ---- the fleet as received -------------------------------------------------------------

  function onMessage(msg) {
    if (msg.type === "fleet") onFleet(msg);
    else if (msg.type === "fleet.host" && msg.record) onRecord(msg.record, performance.now());
    else if (msg.type === "snapshot") onOwnSnapshot(msg);
  }

  function onFleet(msg) {
    if (msg.stale_seconds > 0) staleMs = msg.stale_seconds * 1000;
    const now = performance.now();
    const live = new Set();
    for (const h of msg.hosts || []) {
      live.add(h.host);
      onRecord({ host: h.host, url: h.url, snapshot: h.snapshot }, now - (h.age_seconds || 0) * 1000);
    }
    for (const id of [...hosts.keys()]) if (!live.has(id) && id !== HERE) drop(id);
  }

  // This page's own host: its snapshots come ten times a second, its record once a second.
  function onOwnSnapshot(s) {
    const known = hosts.get(HERE);
    onRecord({ host: HERE, url: known ? known.record.url : null, snapshot: s }, performance.now());
  }

  function onRecord(record, seenAt) {
    if (!record || typeof record.host !== "string" || !record.snapshot) return;
    let h = hosts.get(record.host);
    if (!h) {
      h = { record, seenAt, card: null, plot: null, data: [[], [], []], dirty: true };
      hosts.set(record.host, h);
    } else if ((record.snapshot.time || 0) < (h.record.snapshot.time || 0)) {
      return;     // an older record than the one shown (the state on connect and a record crossed)
    } else {
      h.record = Object.assign({}, record, { url: record.url || h.record.url });
      h.seenAt = Math.max(h.seenAt, seenAt);
    }
    addPoint(h);
    h.dirty = true;
    schedule();
  }

  function drop(id) {
    const h = hosts.get(id);
    if (!h) return;
    if (h.plot) h.plot.destroy();
    if (h.observer) h.observer.disconnect();
    if (h.card) h.card.remove();
    hosts.delete(id);
    schedule();
  }

  function tick() {
    const now = performance.now();
    for (const [id, h] of hosts) if (id !== HERE && now - h.seenAt > staleMs) drop(id);
    schedule();
  }

  function schedule() {
    if (queued) return;
    queued = true;
    requestAnimationFrame(render);
  }

  // Where each model is loaded (or loading), over every live host.
  function whereLoaded(modelId) {
    const found = [];
    for (const [id, h] of hosts) {
      const m = (h.record.snapshot.models || []).find((x) => x.id === modelId);
      if (m && RESIDENT.includes(m.state)) found.push(id);
    }
    return found.sort();
  }

  // ---- rendering ---------------------------------------------------------------------------

  function render() {
    queued = false;
    const ids = [...hosts.keys()].sort();
    $("fleet-count").textContent = ids.length + (ids.length === 1 ? " host" : " hosts");
    const box = $("fleet-hosts");
    ids.forEach((id, i) => {
      const h = hosts.get(id);
      if (!h.card) makeCard(id, h);
      if (box.children[i] !== h.card) box.insertBefore(h.card, box.children[i] || null);
      renderCard(id, h);
    });
    renderPins();
    renderEvents();
  }

  const CARD_HTML =
    '<header><h3></h3><span class="badge here" hidden>this page</span><span class="badge level"></span>' +
    '<a class="open small" target="_blank" rel="noopener">open</a><span class="age muted small"></span></header>' +
    '<div class="modelbar" role="img"><div class="seg models"></div></div>' +
    '<div class="hostnums muted small"></div>' +
    '<div class="hostchart"></div>' +
    '<table class="host-models"><tbody></tbody></table>';

  function makeCard(id, h) {
    const card = document.createElement("article");
    card.className = "host";
    card.dataset.host = id;
    card.innerHTML = CARD_HTML;
    card.querySelector("h3").textContent = id;
    card.querySelector(".here").hidden = id !== HERE;
    h.card = card;
    $("fleet-hosts").appendChild(card);
    makeChart(h, card.querySelector(".hostchart"));
  }

  function renderCard(id, h) {
    const s = h.record.snapshot;
    const m = s.memory || {};
    const card = h.card;
    const level = card.querySelector(".level");
    level.textContent = m.level || "ok";
    level.className = "badge level level-" + (m.level || "ok");
    const open = card.querySelector(".open");
    const web = typeof h.record.url === "string" && /^https?:\/\//.test(h.record.url);
    open.hidden = !web || id === HERE;
    if (web) open.href = h.record.url + "/";
    const age = Math.max(0, (performance.now() - h.seenAt) / 1000);
    card.querySelector(".age").textContent = id === HERE ? "" : "updated " + age.toFixed(0) + " s ago";

    const budget = m.model_budget_bytes;
    const models = m.model_bytes || 0;
    const seg = card.querySelector(".seg.models");
    seg.style.width = Math.min(100, (100 * models) / Math.max(budget || 0, models, 1)) + "%";
    seg.classList.toggle("over", budget != null && models > budget);
    const bar = card.querySelector(".modelbar");
    bar.setAttribute("aria-label", "loaded models " + ui.fmtBytes(models) + " of the model budget");
    card.querySelector(".hostnums").textContent = "models " + ui.fmtBytes(models) + " / " +
      (budget == null ? "no budget" : ui.fmtBytes(budget) + " budget") + " · usage " + ui.fmtBytes(m.usage_bytes) +
      (m.ceiling_bytes != null ? " of " + ui.fmtBytes(m.ceiling_bytes) : "");
    renderHostModels(card.querySelector(".host-models tbody"), s.models || []);
    redraw(h);
  }

  function renderHostModels(body, models) {
    const key = JSON.stringify(models.map((x) => [x.id, x.state, x.pinned, x.measured_bytes, x.size_bytes, x.active_requests]));
    if (body.dataset.key === key) return;
    body.dataset.key = key;
    body.textContent = "";
    for (const x of models) {
      const tr = document.createElement("tr");
      tr.dataset.id = x.id;
      tr.dataset.state = x.state;
      const name = document.createElement("td");
      name.className = "name";
      name.textContent = x.id;
      if (x.pinned) name.append(" ", badge("pinned", "tag tag-pinned"));
      const state = document.createElement("td");
      const lp = x.state === "loading" ? x.load_progress : null;   // the host's snapshot row: bytes of total
      const stateBadge = badge(lp && lp.bytes_total ? "loading " + Math.floor((100 * lp.bytes_done) / lp.bytes_total) + "%" : x.state,
                               "state state-" + x.state);
      if (lp) stateBadge.title = ui.fmtBytes(lp.bytes_done) + " of " + ui.fmtBytes(lp.bytes_total) +
        (lp.eta_seconds != null ? ", ~" + Math.max(1, Math.round(lp.eta_seconds)) + " s left" : "");
      state.appendChild(stateBadge);
      const size = document.createElement("td");
      size.className = "num small";
      size.textContent = ui.fmtBytes(x.measured_bytes != null ? x.measured_bytes : x.size_bytes);
      const acts = document.createElement("td");
      acts.className = "actions";
      const busy = x.state === "loading" || x.state === "unloading";
      const loaded = x.state === "loaded";
      acts.append(button(x.pinned ? "unpin" : "pin", "pin", false),
                  button(busy ? x.state + "…" : loaded ? "unload" : "load", loaded ? "unload" : "load", busy, loaded));
      tr.append(name, state, size, acts);
      body.appendChild(tr);
    }
  }

  function badge(text, cls) {
    const b = document.createElement("span");
    b.className = "badge " + cls;
    b.textContent = text;
    return b;
  }

  function button(text, act, disabled, danger) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = act === "pin" ? "pin" : "load";
    b.dataset.act = text === "unpin" ? "unpin" : act;
    b.textContent = text;
    b.disabled = !!disabled;
    if (danger) b.classList.add("danger");
    return b;
  }

  function renderPins() {
    const pinned = new Set();
    for (const h of hosts.values()) for (const m of h.record.snapshot.models || []) if (m.pinned) pinned.add(m.id);
    const body = document.querySelector("#fleet-pins tbody");
    const rows = [...pinned].sort().map((id) => [id, whereLoaded(id)]);
    const key = JSON.stringify(rows);
    if (body.dataset.key === key) return;
    body.dataset.key = key;
    body.textContent = "";
    for (const [id, where] of rows) {
      const tr = document.createElement("tr");
      tr.dataset.id = id;
      const name = document.createElement("td");
      name.textContent = id;
      const on = document.createElement("td");
      on.className = "where";
      on.textContent = where.length ? where.join(", ") : "nowhere yet: a host will load it";
      if (!where.length) on.classList.add("muted");
      tr.append(name, on);
      body.appendChild(tr);
    }
    $("fleet-pins-empty").hidden = rows.length > 0;
  }

  function renderEvents() {
    const all = [];
    for (const [id, h] of hosts) {
      for (const e of h.record.snapshot.events || []) {
        if (e.model && e.reason) all.push(Object.assign({ host: id }, e));
      }
    }
    all.sort((a, b) => b.time - a.time);
    const shown = all.slice(0, EVENTS_SHOWN);
    const key = shown.map((e) => e.host + ":" + (e.id != null ? e.id : e.time + ":" + e.reason)).join(",");
    const body = document.querySelector("#fleet-events tbody");
    if (body.dataset.key === key) return;
    body.dataset.key = key;
    body.textContent = "";
    for (const e of shown) {
      const tr = document.createElement("tr");
      tr.dataset.host = e.host;
      tr.dataset.model = e.model;
      tr.dataset.reason = e.reason;
      const cells = ["time", "host", "model", "reason", "freed"].map((label) => {
        const td = document.createElement("td");
        td.dataset.label = label;
        tr.appendChild(td);
        return td;
      });
      cells[0].textContent = ui.fmtClock(e.time);
      cells[1].textContent = e.host;
      cells[2].textContent = e.model;
      cells[3].appendChild(badge(e.reason, "reason reason-" + e.reason));
      cells[4].textContent = ui.fmtBytes(e.freed_bytes);
      cells[4].className = "num";
      body.appendChild(tr);
    }
    $("fleet-events-empty").hidden = shown.length > 0;
  }

  // The main table's rows: where in the fleet each model is loaded.
  function decorateRow(tr, m) {
    let line = tr.querySelector(".on-hosts");
    if (!line) {
      line = document.createElement("div");
      line.className = "on-hosts muted small";
      tr.querySelector("td.name").appendChild(line);
    }
    const where = whereLoaded(m.id).map((id) => (id === HERE ? id + " (here)" : id));
    const text = where.length ? "loaded on " + where.join(", ") : "not loaded in the fleet";
    if (line.textContent !== text) line.textContent = text;
  }

  // ---- the small chart: usage and loaded models over the last minutes (the bar above has the budget)

  function makeChart(h, el) {
    if (typeof uPlot === "undefined") return;
    const bytes = (u, v) => (v == null ? "–" : ui.fmtBytes(v));
    const width = () => Math.max(200, el.clientWidth);
    h.plot = new uPlot({
      width: width(), height: 110, legend: { show: false },
      scales: {
        x: { time: true, range: () => span(h) },
        y: { range: (u, min, max) => [0, Math.max(max || 0, 1e6) * 1.1] },
      },
      axes: [{ size: 24, font: "10px system-ui" }, { values: (u, t) => t.map(ui.fmtAxisBytes), size: 56, font: "10px system-ui" }],
      series: [{}, { label: "usage", stroke: "#2563eb", width: 1.5, value: bytes },
               { label: "loaded models", stroke: "#16a34a", fill: "rgba(22,163,74,0.12)", width: 1, value: bytes }],
      cursor: { drag: { x: false, y: false } },
    }, h.data, el);
    if (window.ResizeObserver) {
      h.observer = new ResizeObserver(() => h.plot && h.plot.setSize({ width: width(), height: 110 }));
      h.observer.observe(el);
    }
  }

  // The last CHART_SECONDS, or since the page began watching the host (at least a minute).
  function span(h) {
    const t = h.data[0];
    const last = t.length ? t[t.length - 1] : Date.now() / 1000;
    const first = t.length ? t[0] : last;
    return [Math.min(last - 60, Math.max(first, last - CHART_SECONDS)), last];
  }

  function addPoint(h) {
    const s = h.record.snapshot;
    const m = s.memory || {};
    const d = h.data;
    const n = d[0].length;
    if (typeof s.time !== "number" || (n && s.time < d[0][n - 1])) return;
    // at most one point a second: a point keeps its time and takes the second's latest values
    const i = n && s.time - d[0][n - 1] < 1 ? n - 1 : n;
    if (i === n) d[0][i] = s.time;
    d[1][i] = m.usage_bytes ?? null; d[2][i] = m.model_bytes ?? null;
    let cut = 0;
    while (cut < d[0].length && d[0][cut] < s.time - CHART_SECONDS - 30) cut++;
    if (cut) d.forEach((col) => col.splice(0, cut));
  }

  function redraw(h) {
    if (!h.plot || !h.dirty) return;
    h.dirty = false;
    h.plot.setData(h.data);
  }

  // ---- actions: on the host whose card holds the button ------------------------------------

  function onClick(ev) {
    const btn = ev.target.closest("button[data-act]");
    if (!btn) return;
    const host = btn.closest("article.host").dataset.host;
    const id = btn.closest("tr").dataset.id;
    const act = btn.dataset.act;
    const h = hosts.get(host);
    const m = h && (h.record.snapshot.models || []).find((x) => x.id === id);
    if (act === "unload" && m && m.active_requests > 0) {
      if (confirm("'" + id + "' is serving " + m.active_requests + " request(s) on " + host +
                  ". Unloading aborts them. Unload anyway?")) ui.send("unload", id, { host, force: true });
      return;
    }
    ui.send(act, id, { host });
  }

  window.omlxFleet = {
    init(helpers) {
      ui = helpers;
      $("fleet-hosts").addEventListener("click", onClick);
      setInterval(tick, 1000);
      schedule();
    },
    onMessage,
    decorateRow,
    get hosts() { return [...hosts.keys()].sort(); },
  };
})();
