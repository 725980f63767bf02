/* One request's trace as the console shows it: `norm` reads a trace of /api/requests (or of the
   websocket's requests message) into the few fields the page uses, and `render` draws its timeline:
   the waits, the load, the prefill and the decode as bars on one time axis, and the memory it held. */
(function () {
  "use strict";

  // in the order a request meets them (pool/serving/door.py): the gate, the lease (a load), a slot
  const PHASES = [
    ["gate", "gate", "admission_ms", "waiting at the gate (memory pressure)"],
    ["load", "load", "load_ms", "waiting for the model to load"],
    ["queue", "slot", "slot_ms", "waiting for a concurrency slot"],
    ["prefill", "prefill", "prefill_ms", "reading the prompt"],
    ["decode", "decode", null, "generating: from the first token to the end"],
  ];

  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const secs = (v) => (num(v) == null ? null : v / 1000);

  // A trace as docs/api.md's "Requests" section gives it, in seconds and the page's words.
  function norm(t) {
    const phases = {};
    for (const [name, , field] of PHASES) if (field && num(t[field]) != null) phases[name] = t[field] / 1000;
    const total = secs(t.duration_ms);
    const ttft = secs(t.ttft_ms);
    if (total != null && ttft != null && t.completion_tokens) phases.decode = Math.max(0, total - ttft);
    const status = t.cancelled ? "cancelled" : t.error ? "error" : t.ended == null ? "running" :
      num(t.status) != null && t.status >= 400 ? "error" : "ok";
    return {
      raw: t,
      id: String(t.id || ""),
      model: t.model || "",
      route: t.route || "",
      host: t.host || "",
      dialect: t.dialect || "",
      status,
      http: t.status,
      phase: t.phase || "",
      started: num(t.time),
      ended: num(t.ended),
      total, ttft, phases,
      prompt: num(t.prompt_tokens),
      cached: num(t.cached_tokens),
      completion: num(t.completion_tokens),
      prefillDone: num(t.prefill_done),
      prefillTotal: num(t.prefill_total),
      tps: num(t.decode_tps),
      kv: num(t.peak_kv_bytes),
      hitTokens: num(t.prompt_cache_hit_tokens),
      loadModel: t.load_model || "",
      evictions: t.evictions || [],
      error: t.error || (t.disconnected ? "client disconnected" : ""),
      key: t.key || "",
      waited: (secs(t.admission_ms) || 0) + (secs(t.slot_ms) || 0) + (secs(t.load_ms) || 0),
    };
  }

  // The trace panel: a header, one bar per phase on a shared axis, and the memory lines.
  function render(box, tr, fmt) {
    box.textContent = "";
    box.dataset.id = tr.id;
    const head = document.createElement("div");
    head.className = "trace-head";
    const title = document.createElement("b");
    title.textContent = "Request " + tr.id;
    const meta = document.createElement("span");
    meta.className = "muted small";
    meta.textContent = [tr.model, tr.host ? "on " + tr.host : "", tr.route, tr.http != null ? "HTTP " + tr.http : "", tr.status,
                        tr.key ? "key " + tr.key : ""].filter(Boolean).join(" · ");
    head.append(title, " ", meta);
    box.appendChild(head);
    if (tr.error) {
      const err = document.createElement("p");
      err.className = "trace-error";
      err.textContent = tr.error;
      box.appendChild(err);
    }
    const total = Math.max(tr.total || 0, Object.values(tr.phases).reduce((a, b) => a + b, 0), 1e-6);
    const tl = document.createElement("div");
    tl.className = "timeline";
    tl.setAttribute("role", "list");
    let at = 0;
    for (const [name, label, , title2] of PHASES) {
      const secs = tr.phases[name];
      if (secs == null) continue;
      const row = document.createElement("div");
      row.className = "tl-row";
      row.dataset.phase = name;
      row.setAttribute("role", "listitem");
      row.title = title2;
      const l = document.createElement("span");
      l.className = "tl-label";
      l.textContent = label;
      const track = document.createElement("span");
      track.className = "tl-track";
      const bar = document.createElement("i");
      bar.className = "tl-bar tl-" + name;
      bar.style.marginLeft = (100 * at) / total + "%";
      bar.style.width = Math.max(0.5, (100 * secs) / total) + "%";
      track.appendChild(bar);
      const v = document.createElement("span");
      v.className = "tl-value num";
      v.textContent = fmt.seconds(secs);
      row.append(l, track, v);
      tl.appendChild(row);
      at += secs;
    }
    if (!tl.children.length) tl.textContent = "No timeline recorded for this request.";
    box.appendChild(tl);
    const facts = [
      ["total", fmt.seconds(tr.total)], ["TTFT", fmt.seconds(tr.ttft)],
      ["tokens", (tr.prompt ?? "–") + (tr.cached ? " (" + tr.cached + " cached)" : "") + " → " + (tr.completion ?? "–")],
      ["tok/s", tr.tps != null ? tr.tps.toFixed(1) : "–"], ["KV held", fmt.bytes(tr.kv)],
    ];
    if (tr.hitTokens) facts.push(["prompt cache hit", tr.hitTokens + " tokens"]);
    if (tr.loadModel) facts.push(["waited for the load of", tr.loadModel]);
    if (tr.evictions.length) facts.push(["its load evicted", tr.evictions.length + " model(s)"]);
    if (tr.phase === "prefilling" && tr.prefillTotal) facts.push(["prompt read", tr.prefillDone + " of " + tr.prefillTotal]);
    const dl = document.createElement("dl");
    dl.className = "trace-facts";
    for (const [k, v] of facts) {
      const d = document.createElement("div");
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.textContent = v;
      d.append(dt, dd);
      dl.appendChild(d);
    }
    box.appendChild(dl);
  }

  window.omlxTrace = { norm, render, PHASES };
})();
