/* The live dashboard: one websocket (/ws/pool/) carrying whole pool snapshots, plain DOM updates
   and a uPlot chart. No build step: this file is served as is. */
(function () {
  "use strict";

  const cfg = JSON.parse(document.getElementById("dashboard-config").textContent);
  const W = cfg.window_seconds || 900;
  const $ = (id) => document.getElementById(id);
  // In a fleet, static/dashboard/fleet.js (loaded first) sees every message and adds to each model row.
  const fleet = window.omlxFleet || null;
  // The console (console.js, perf.js, playground.js: loaded first) sees every message too.
  const extras = [window.omlxConsole, window.omlxPlayground].filter(Boolean);

  // ---- formatting ------------------------------------------------------------------------

  function fmtBytes(n) {
    if (n == null || Number.isNaN(n)) return "–";
    const a = Math.abs(n);
    if (a >= 1e9) return (n / 1e9).toFixed(2) + " GB";
    if (a >= 1e6) return (n / 1e6).toFixed(1) + " MB";
    if (a >= 1e3) return (n / 1e3).toFixed(0) + " kB";
    return n + " B";
  }

  function fmtAxisBytes(n) {
    if (n >= 1e9) return (n / 1e9).toFixed(n >= 1e10 ? 0 : 1) + " GB";
    if (n >= 1e6) return (n / 1e6).toFixed(0) + " MB";
    return (n / 1e3).toFixed(0) + " kB";
  }

  function fmtDuration(s) {
    if (s == null) return "–";
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " m " + String(s % 60).padStart(2, "0") + " s";
    const h = Math.floor(m / 60);
    return h + " h " + String(m % 60).padStart(2, "0") + " m";
  }

  function fmtClock(epoch) {
    return new Date(epoch * 1000).toLocaleTimeString([], { hour12: false });
  }

  function toast(text, kind) {
    const box = document.createElement("div");
    box.className = "toast " + (kind || "");
    box.setAttribute("role", kind === "error" ? "alert" : "status");
    box.textContent = text;
    $("toasts").appendChild(box);
    setTimeout(() => box.remove(), kind === "error" ? 8000 : 3000);
  }

  // ---- state -----------------------------------------------------------------------------

  let snap = null;          // the latest whole snapshot
  let receivedAt = 0;       // performance.now() when it arrived; countdowns run from there
  const elapsed = () => (performance.now() - receivedAt) / 1000;
  const serverNow = () => (snap ? snap.time + elapsed() : Date.now() / 1000);

  // ---- the websocket, with backoff -------------------------------------------------------

  let ws = null;
  let opened = false;
  let delay = 500;
  let failures = 0;
  let retryAt = 0;
  let retryTimer = null;

  function setConn(state, text) {
    const el = $("conn");
    el.dataset.state = state;
    el.querySelector("span").textContent = text || state;
  }

  function connect() {
    clearTimeout(retryTimer);
    retryTimer = null;
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const socket = new WebSocket(scheme + location.host + cfg.ws_path);
    ws = socket;
    opened = false;
    setConn("connecting", "connecting");
    $("retry").textContent = "Reconnecting now…";
    socket.onopen = () => {
      opened = true;
      delay = 500;
      failures = 0;
      setConn("live", "live");
      document.body.classList.remove("stale");
      $("disconnected").hidden = true;
      $("relogin").hidden = true;
      for (const x of extras) if (x.onOpen) x.onOpen();
    };
    socket.onmessage = (ev) => {
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch (e) {
        return;
      }
      if (msg.type === "snapshot") onSnapshot(msg);
      else if (msg.type === "error") toast(msg.message, "error");
      if (fleet) fleet.onMessage(msg);
      for (const x of extras) x.onMessage(msg);
    };
    socket.onclose = () => {
      if (ws !== socket) return;
      ws = null;
      if (!opened && ++failures >= 2) checkSession();
      scheduleReconnect();
    };
  }

  function scheduleReconnect() {
    const wait = delay * (0.8 + Math.random() * 0.4);
    delay = Math.min(delay * 2, 15000);
    retryAt = performance.now() + wait;
    setConn("offline", "disconnected");
    document.body.classList.add("stale");
    $("disconnected").hidden = false;
    retryTimer = setTimeout(connect, wait);
    updateRetry();
  }

  function updateRetry() {
    if (!retryTimer) return;
    const left = Math.max(0, (retryAt - performance.now()) / 1000);
    $("retry").textContent = "Reconnecting in " + Math.ceil(left) + " s…";
  }

  // A refused handshake looks like any other drop to the browser: ask the page itself whether
  // the session still lets us in.
  function checkSession() {
    fetch(location.pathname, { redirect: "manual", cache: "no-store", credentials: "same-origin" })
      .then((r) => { if (r.type === "opaqueredirect" || r.status === 302) $("relogin").hidden = false; })
      .catch(() => {});
  }

  function send(action, model, extra) {
    if (!ws || ws.readyState !== WebSocket.OPEN) {
      toast("Not connected: try again once the page is live.", "error");
      return false;
    }
    ws.send(JSON.stringify(Object.assign({ action: action, model: model }, extra || {})));
    return true;
  }

  // ---- snapshots -------------------------------------------------------------------------

  let frameQueued = false;

  function onSnapshot(s) {
    snap = s;
    receivedAt = performance.now();
    addLivePoint(s);
    if (!frameQueued) {
      frameQueued = true;
      requestAnimationFrame(render);
    }
  }

  function render() {
    frameQueued = false;
    if (!snap) return;
    renderMemory(snap.memory || {});
    renderModels(snap);
    renderEvents(snap.events || []);
    redrawChart();
  }

  // ---- memory ----------------------------------------------------------------------------

  function renderMemory(m) {
    const level = m.level || "ok";
    const badge = $("level");
    badge.textContent = level;
    badge.className = "badge level level-" + level;
    $("paused").hidden = !m.admission_paused;
    $("waiting").textContent = m.admission_waiting || 0;

    const usage = m.usage_bytes || 0;
    const active = m.active_bytes || 0;
    const cache = m.cache_bytes || 0;
    const scale = Math.max(m.ceiling_bytes || 0, usage, m.model_budget_bytes || 0, m.hard_bytes || 0, 1) * 1.04;
    const pct = (v) => Math.min(100, (100 * v) / scale) + "%";
    $("seg-active").style.width = pct(active);
    $("seg-cache").style.width = pct(cache);
    $("seg-other").style.width = pct(Math.max(0, usage - active - cache));
    for (const [id, value] of [["line-budget", m.model_budget_bytes], ["line-soft", m.soft_bytes],
                               ["line-hard", m.hard_bytes], ["line-ceiling", m.ceiling_bytes]]) {
      const line = $(id);
      line.hidden = value == null;
      if (value != null) line.style.left = pct(value);
    }
    const budget = m.model_budget_bytes;
    const models = m.model_bytes || 0;
    const modelScale = Math.max(budget || 0, models, 1);
    const seg = $("seg-models");
    seg.style.width = Math.min(100, (100 * models) / modelScale) + "%";
    seg.classList.toggle("over", budget != null && models > budget);

    $("v-active").textContent = fmtBytes(active);
    $("v-cache").textContent = fmtBytes(cache);
    $("v-other").textContent = fmtBytes(Math.max(0, usage - active - cache));
    $("v-usage").textContent = fmtBytes(usage);
    $("v-models").textContent = fmtBytes(models);
    $("v-budget").textContent = budget == null ? "none" : fmtBytes(budget);
    $("v-soft").textContent = m.soft_bytes == null ? "off" : fmtBytes(m.soft_bytes);
    $("v-hard").textContent = m.hard_bytes == null ? "off" : fmtBytes(m.hard_bytes);
    $("v-ceiling").textContent = m.ceiling_bytes == null ? "off" : fmtBytes(m.ceiling_bytes);
    $("v-available").textContent = fmtBytes(m.available_bytes);
    $("v-available").title = "of " + fmtBytes(m.total_bytes);
    $("mem-note").textContent = "Enforcer: checks every " + fmtDuration(m.poll_interval) +
      " now · peak MLX " + fmtBytes(m.peak_bytes) + " · reclaimable " + fmtBytes(m.reclaimable_bytes);
  }

  // ---- models ----------------------------------------------------------------------------

  const rows = new Map();   // model id -> row parts, kept so an input being typed in survives updates

  const ROW_HTML =
    '<td class="rank" data-label="order"></td>' +
    '<td class="name" data-label="model"><div class="primary"></div><div class="secondary muted small"></div>' +
    '<div class="badges"></div></td>' +
    '<td class="state" data-label="state"><span class="badge state"></span>' +
    '<div class="progress" hidden><div></div></div><div class="note muted small"></div></td>' +
    '<td class="size" data-label="size"></td>' +
    '<td class="kv" data-label="memory"><div class="kvbar" role="img"><div class="seg weights"></div>' +
    '<div class="seg live"></div><div class="seg pcache"></div></div><div class="kvnote muted small"></div></td>' +
    '<td class="active num" data-label="running"><span class="running"></span><div class="queued muted small"></div></td>' +
    '<td class="idle num" data-label="idle"></td>' +
    '<td class="ttl" data-label="TTL"></td>' +
    '<td class="actions" data-label="actions"><button type="button" class="pin"></button>' +
    '<button type="button" class="load"></button>' +
    '<form class="ttl-form"><input type="number" min="0" step="1" inputmode="numeric" aria-label="TTL in seconds">' +
    '<button type="submit">set TTL</button></form></td>';

  function makeRow(id) {
    const tr = document.createElement("tr");
    tr.dataset.id = id;
    tr.innerHTML = ROW_HTML;
    const q = (sel) => tr.querySelector(sel);
    return {
      tr, rank: q(".rank"), primary: q(".primary"), secondary: q(".secondary"), badges: q(".badges"),
      state: q(".state .badge"), progress: q(".progress"), bar: q(".progress div"), note: q(".state .note"),
      size: q(".size"), running: q(".active .running"), queued: q(".active .queued"), idle: q(".idle"), ttl: q(".ttl"),
      kvbar: q(".kvbar"), weights: q(".seg.weights"), live: q(".seg.live"), pcache: q(".seg.pcache"), kvnote: q(".kvnote"),
      pin: q("button.pin"), load: q("button.load"), ttlInput: q(".ttl-form input"),
    };
  }

  function setBadges(box, names) {
    const key = names.join(",");
    if (box.dataset.key === key) return;
    box.dataset.key = key;
    box.textContent = "";
    for (const name of names) {
      const b = document.createElement("span");
      b.className = "badge tag tag-" + name.split(" ")[0];
      b.textContent = name;
      box.appendChild(b);
    }
  }

  function updateRow(r, m, later) {
    const tr = r.tr;
    tr.dataset.state = m.state;
    tr.classList.toggle("next-victim", m.lru_rank === 0);
    tr.classList.toggle("pinned", m.pinned);

    r.rank.textContent = m.lru_rank != null ? String(m.lru_rank + 1) : "–";
    r.rank.title = m.lru_rank === 0 ? "next to be evicted" :
      m.lru_rank != null ? "eviction order" : "not evictable now (pinned, busy or not loaded)";
    const primary = m.display_name || m.alias || m.id;
    r.primary.textContent = primary;
    r.secondary.textContent = [primary === m.id ? "" : m.id + (m.alias && primary !== m.alias ? " · alias " + m.alias : ""),
                               m.kind === "embeddings" ? "embeddings" : ""].filter(Boolean).join(" · ");
    const badges = [];
    if (m.lru_rank === 0) badges.push("next victim");
    if (m.pinned) badges.push("pinned");
    if (m.hidden) badges.push("hidden");
    if (m.marked_for_unload) badges.push("marked " + m.marked_for_unload);
    setBadges(r.badges, badges);

    r.state.textContent = m.state === "loading" ? "loading " + ((m.loading_seconds || 0) + later).toFixed(1) + " s" : m.state;
    r.state.className = "badge state state-" + m.state;
    r.progress.hidden = m.state !== "loading";
    const lp = m.state === "loading" ? m.load_progress : null;
    if (m.state === "loading") {
      // The weight bytes made resident of the total (load_progress); else against the last load's time.
      const known = !!(lp && lp.bytes_total) || (m.load_seconds && m.load_seconds > 0);
      r.progress.classList.toggle("indeterminate", !known);
      r.bar.style.width = lp && lp.bytes_total ? (100 * lp.bytes_done) / lp.bytes_total + "%" :
        known ? Math.min(95, (100 * ((m.loading_seconds || 0) + later)) / m.load_seconds) + "%" : "";
    }
    r.note.textContent = m.state === "failed" ? m.failure || "" : m.load_note || "";
    if (lp) r.note.textContent = loadProgressText(lp, later);
    if (m.state === "loaded" && m.load_seconds != null && !m.load_note) r.note.textContent = "loaded in " + m.load_seconds + " s";

    r.size.textContent = fmtBytes(m.size_bytes) + " / " + (m.measured_bytes != null ? fmtBytes(m.measured_bytes) : "–");
    updateMemory(r, m);
    // running: holding one of the model's concurrency slots; queued: waiting for one
    r.running.textContent = String(m.running || 0);
    r.queued.textContent = m.queued ? m.queued + " queued" : "";
    r.idle.textContent = m.idle_seconds != null ? fmtDuration(m.idle_seconds + later) : "–";

    let ttl;
    if (m.keep_alive != null && m.keep_alive < 0) ttl = "kept until evicted";
    else if (m.ttl_remaining_seconds != null) ttl = "unload in " + fmtDuration(m.ttl_remaining_seconds - later);
    else if (m.ttl_seconds != null) ttl = fmtDuration(m.ttl_seconds) + " idle";
    else ttl = "never";
    r.ttl.textContent = ttl;
    r.ttl.title = m.ttl_seconds != null ? "TTL " + m.ttl_seconds + " s" : "no TTL (global default)";

    r.pin.textContent = m.pinned ? "unpin" : "pin";
    r.pin.dataset.act = m.pinned ? "unpin" : "pin";
    r.pin.setAttribute("aria-pressed", m.pinned ? "true" : "false");
    const busy = m.state === "loading" || m.state === "unloading";
    const loaded = m.state === "loaded";
    r.load.textContent = busy ? m.state + "…" : loaded ? "unload" : "load";
    r.load.dataset.act = loaded ? "unload" : "load";
    r.load.disabled = busy;
    r.load.classList.toggle("danger", loaded);
    const placeholder = m.ttl_seconds != null ? String(m.ttl_seconds) : "default";
    if (document.activeElement !== r.ttlInput) r.ttlInput.placeholder = placeholder;
    if (fleet) fleet.decorateRow(r.tr, m);
  }

  // "1.2 GB of 2.7 GB · ~3 s left": the eta counts down between snapshots.
  function loadProgressText(lp, later) {
    const left = lp.eta_seconds != null ? " · ~" + fmtDuration(Math.max(1, lp.eta_seconds - later)) + " left" : "";
    return fmtBytes(lp.bytes_done) + " of " + fmtBytes(lp.bytes_total) + left;
  }

  // One stacked bar per loaded model: its weights, its running requests' KV and its prompt cache,
  // all drawn to one scale (the largest loaded model's total), with the cache's hit rate.
  let memoryScale = 1;

  function modelTotal(m) {
    return (m.measured_bytes || 0) + (m.kv_bytes || 0) + (m.prompt_cache_bytes || 0);
  }

  function updateMemory(r, m) {
    const loaded = m.state === "loaded";
    r.kvbar.hidden = !loaded;
    if (!loaded) {
      r.kvnote.textContent = "";
      return;
    }
    const parts = [[r.weights, m.measured_bytes, "weights"], [r.live, m.kv_bytes, "live KV"],
                   [r.pcache, m.prompt_cache_bytes, "prompt cache"]];
    for (const [seg, bytes] of parts) seg.style.width = (100 * (bytes || 0)) / memoryScale + "%";
    r.kvbar.title = parts.map(([, bytes, name]) => name + " " + fmtBytes(bytes || 0)).join(" · ");
    r.kvbar.setAttribute("aria-label", r.kvbar.title);
    const asked = (m.prompt_cache_hits || 0) + (m.prompt_cache_misses || 0);
    const rate = asked ? Math.round((100 * m.prompt_cache_hits) / asked) + "% hits" : "no requests yet";
    r.kvnote.textContent = "KV " + fmtBytes(m.kv_bytes || 0) + " · cache " + fmtBytes(m.prompt_cache_bytes || 0) +
      " (" + (m.prompt_cache_entries || 0) + ") · " + rate;
  }

  function renderModels(s) {
    memoryScale = Math.max(1, ...s.models.filter((m) => m.state === "loaded").map(modelTotal));
    const tbody = document.querySelector("#models tbody");
    const later = elapsed();
    const seen = new Set();
    s.models.forEach((m, i) => {
      let r = rows.get(m.id);
      if (!r) {
        r = makeRow(m.id);
        rows.set(m.id, r);
      }
      updateRow(r, m, later);
      seen.add(m.id);
      if (tbody.children[i] !== r.tr) tbody.insertBefore(r.tr, tbody.children[i] || null);
    });
    for (const [id, r] of rows) {
      if (!seen.has(id)) {
        r.tr.remove();
        rows.delete(id);
      }
    }
    const loaded = s.models.filter((m) => m.state === "loaded").length;
    $("models-note").textContent = loaded + " of " + s.models.length + " loaded" +
      (s.max_loaded_models ? " (at most " + s.max_loaded_models + ")" : "");
  }

  function modelById(id) {
    return snap && snap.models.find((m) => m.id === id);
  }

  const tbody = document.querySelector("#models tbody");
  tbody.addEventListener("click", (ev) => {
    const btn = ev.target.closest("button[data-act]");
    if (!btn) return;
    const id = btn.closest("tr").dataset.id;
    const act = btn.dataset.act;
    const m = modelById(id);
    if (act === "unload" && m && m.active_requests > 0) {
      const ok = confirm("'" + id + "' is serving " + m.active_requests +
                         " request(s). Unloading aborts them. Unload anyway?");
      if (ok) send("unload", id, { force: true });
      return;
    }
    send(act, id);
  });
  tbody.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const id = ev.target.closest("tr").dataset.id;
    const input = ev.target.querySelector("input");
    const text = input.value.trim();
    const ttl = text === "" ? null : Number(text);
    if (ttl !== null && (!Number.isInteger(ttl) || ttl < 0)) {
      toast("TTL: whole seconds (0 or more), or empty for the global default.", "error");
      return;
    }
    if (send("set_ttl", id, { ttl_seconds: ttl })) {
      input.value = "";
      input.blur();
    }
  });

  // ---- eviction timeline -----------------------------------------------------------------

  let eventsKey = null;
  let marks = [];

  function historyLink(params, text) {
    const a = document.createElement("a");
    a.href = cfg.history_url + "?" + new URLSearchParams(params).toString();
    a.textContent = text;
    return a;
  }

  function renderEvents(events) {
    const key = events.map((e) => e.id != null ? e.id : e.time + ":" + e.reason).join(",");
    if (key === eventsKey) return;
    eventsKey = key;
    marks = events.filter((e) => e.model && e.reason !== "cache_reclaim").map((e) => ({ t: e.time, reason: e.reason }));
    const body = document.querySelector("#events tbody");
    body.textContent = "";
    for (const e of events) {
      const tr = document.createElement("tr");
      tr.dataset.reason = e.reason;
      tr.dataset.model = e.model || "";
      if (e.warning) tr.classList.add("warning");
      const cells = [];
      for (let i = 0; i < 6; i++) {
        const td = document.createElement("td");
        td.dataset.label = ["time", "model", "reason", "freed", "requested by", "detail"][i];
        cells.push(td);
        tr.appendChild(td);
      }
      cells[0].textContent = fmtClock(e.time);
      cells[0].title = new Date(e.time * 1000).toString();
      if (e.model) cells[1].appendChild(historyLink({ model_id: e.model }, e.model));
      else cells[1].textContent = "–";
      const reason = historyLink({ reason: e.reason }, e.reason);
      reason.className = "badge reason reason-" + e.reason;
      cells[2].appendChild(reason);
      cells[3].textContent = fmtBytes(e.freed_bytes);
      cells[3].title = "estimated " + fmtBytes(e.estimated_bytes) + (e.rss_freed_bytes != null ? ", RSS freed " + fmtBytes(e.rss_freed_bytes) : "") +
        (e.duration_ms ? ", " + e.duration_ms + " ms" : "");
      cells[3].className = "num";
      cells[4].textContent = e.requested_by || "–";
      cells[5].textContent = (e.warning ? "⚠ " : "") + (e.detail || "");
      cells[5].className = "muted small";
      body.appendChild(tr);
    }
    $("events-empty").hidden = events.length > 0;
  }

  // ---- chart -----------------------------------------------------------------------------

  const data = [[], [], [], [], []];   // t, usage, model bytes, soft, hard
  let plot = null;
  let chartQueued = false;

  const REASON_COLORS = { lru: "#7c3aed", count_cap: "#7c3aed", ttl: "#0891b2", keep_alive: "#0891b2",
                          manual: "#475569", pressure_soft: "#d97706", pressure_hard: "#dc2626",
                          emergency: "#dc2626" };

  // One dashed line in `color` on the chart's canvas; leaves that colour as the fill for a label.
  function dashedLine(ctx, color, dash, x0, y0, x1, y1) {
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = window.devicePixelRatio || 1;
    ctx.setLineDash(dash);
    ctx.beginPath();
    ctx.moveTo(x0, y0);
    ctx.lineTo(x1, y1);
    ctx.stroke();
  }

  function evictionMarks() {
    return {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx;
          const { left, top, width, height } = u.bbox;
          const dpr = window.devicePixelRatio || 1;
          ctx.save();
          // The current soft and hard lines across the whole window, labelled, even before history exists.
          const mem = (snap && snap.memory) || {};
          ctx.font = 11 * dpr + "px system-ui, sans-serif";
          ctx.textAlign = "right";
          for (const [value, color, name] of [[mem.soft_bytes, "#d97706", "soft"], [mem.hard_bytes, "#dc2626", "hard"]]) {
            if (value == null) continue;
            const y = Math.round(u.valToPos(value, "y", true));
            if (y < top || y > top + height) continue;
            dashedLine(ctx, color, [6 * dpr, 4 * dpr], left, y, left + width, y);
            ctx.fillText(name + " " + fmtBytes(value), left + width - 4 * dpr, name === "hard" ? y - 3 * dpr : y + 12 * dpr);
          }
          for (const mk of marks) {
            const x = Math.round(u.valToPos(mk.t, "x", true));
            if (x < left || x > left + width) continue;
            const color = REASON_COLORS[mk.reason] || "#475569";
            dashedLine(ctx, color, [3 * dpr, 3 * dpr], x, top, x, top + height);
            ctx.setLineDash([]);
            ctx.beginPath();
            ctx.moveTo(x - 5 * dpr, top);
            ctx.lineTo(x + 5 * dpr, top);
            ctx.lineTo(x, top + 7 * dpr);
            ctx.closePath();
            ctx.fill();
          }
          ctx.restore();
        }],
      },
    };
  }

  function chartWidth() {
    return Math.max(240, $("chart").clientWidth);
  }

  function initChart() {
    if (typeof uPlot === "undefined") {
      $("chart-note").textContent = "The chart library did not load.";
      return;
    }
    const bytesValue = (u, v) => (v == null ? "–" : fmtBytes(v));
    plot = new uPlot({
      width: chartWidth(),
      height: 220,
      scales: {
        x: { time: true, range: () => { const now = serverNow(); return [now - W, now]; } },
        y: { range: (u, min, max) => [0, Math.max(max || 0, (snap && snap.memory.hard_bytes) || 0, 1e6) * 1.08] },
      },
      axes: [{}, { values: (u, ticks) => ticks.map(fmtAxisBytes), size: 64 }],
      series: [
        {},
        { label: "usage", stroke: "#2563eb", width: 2, value: bytesValue },
        { label: "loaded models", stroke: "#16a34a", fill: "rgba(22,163,74,0.12)", width: 1.5, value: bytesValue },
        { label: "soft", stroke: "#d97706", dash: [6, 4], width: 1, value: bytesValue },
        { label: "hard", stroke: "#dc2626", dash: [6, 4], width: 1, value: bytesValue },
      ],
      cursor: { drag: { x: false, y: false } },
      plugins: [evictionMarks()],
    }, data, $("chart"));
    if (window.ResizeObserver) {
      new ResizeObserver(() => plot.setSize({ width: chartWidth(), height: 220 })).observe($("chart"));
    }
  }

  function pushPoint(t, usage, models, soft, hard) {
    const n = data[0].length;
    // At most one point a second: snapshots arrive up to 10 a second. The newest point moves until it
    // is a second past the one before it (measured from that one, so steady updates still add points).
    const i = n > 1 && t - data[0][n - 2] < 1 ? n - 1 : n;
    if (n && t < data[0][n - 1]) return;
    data[0][i] = t; data[1][i] = usage; data[2][i] = models; data[3][i] = soft; data[4][i] = hard;
  }

  function trim(now) {
    let drop = 0;
    while (drop < data[0].length && data[0][drop] < now - W - 30) drop++;
    if (drop) data.forEach((col) => col.splice(0, drop));
  }

  function addLivePoint(s) {
    const m = s.memory || {};
    pushPoint(s.time, m.usage_bytes ?? null, m.model_bytes ?? null, m.soft_bytes ?? null, m.hard_bytes ?? null);
    trim(s.time);
  }

  function redrawChart() {
    if (!plot || chartQueued) return;
    chartQueued = true;
    requestAnimationFrame(() => {
      chartQueued = false;
      plot.setData(data);
    });
  }

  async function loadHistory() {
    const since = Math.floor(Date.now() / 1000 - W);
    const note = $("chart-note");
    try {
      const r = await fetch(cfg.telemetry_url + "?since=" + since + "&step=5",
                            { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!r.ok) {
        note.textContent = r.status === 404 ? "No stored history on this server: the chart fills in live."
          : "History unavailable (HTTP " + r.status + "): the chart fills in live.";
        return;
      }
      const body = await r.json();
      const first = data[0].length ? data[0][0] : Infinity;
      const points = (body.points || []).filter((p) => p && typeof p.t === "number" && p.t < first - 0.5)
        .sort((a, b) => a.t - b.t);
      const cols = [points.map((p) => p.t), points.map((p) => p.usage ?? null), points.map((p) => p.model_bytes ?? null),
                    points.map((p) => p.soft ?? null), points.map((p) => p.hard ?? null)];
      cols.forEach((col, i) => data[i].unshift(...col));
      note.textContent = "Triangles mark evictions; hover for values.";
      redrawChart();
    } catch (e) {
      note.textContent = "History unavailable: the chart fills in live.";
    }
  }

  // ---- start -----------------------------------------------------------------------------

  initChart();
  connect();
  loadHistory();
  // Countdowns, idle times and the chart's time axis move between snapshots.
  setInterval(() => {
    updateRetry();
    if (snap) {
      renderModels(snap);
      redrawChart();
    }
    if (window.omlxConsole) window.omlxConsole.tick();
  }, 1000);

  window.omlxDashboard = {
    get snapshot() { return snap; },
    get connected() { return !!ws && ws.readyState === WebSocket.OPEN; },
    send: send,
  };
  if (fleet) fleet.init({ send, toast, fmtBytes, fmtAxisBytes, fmtClock, fmtDuration, historyLink });
  if (window.omlxConsole) window.omlxConsole.init({ toast, fmtBytes, fmtClock, fmtDuration });
})();
