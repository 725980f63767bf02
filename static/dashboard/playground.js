/* The playground: pick a chat model, send a message, read the answer as it streams from
   /v1/chat/completions (this page's session: its cookies and CSRF token, never a key), stop it, and
   see the request's own trace once the websocket brings it (matched by the x-omlx-request-id header).
   A load's progress comments show in the status line while the model loads. In a fleet, the other
   hosts' models are offered too: the fleet routes the chat there, and its trace comes in that host's
   record (console.js finds it by the same id, which the forwarded answer carries). */
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
  const cfg = JSON.parse(document.getElementById("dashboard-config").textContent);
  const C = window.omlxConsole;
  const form = $("playground");
  const select = $("pg-model");
  const out = $("pg-output");
  const status = $("pg-status");
  let controller = null;
  let mine = null;             // {requestId, completionId} of the latest request sent here
  let here = [];               // this host's models, from its snapshot
  const elsewhere = new Map(); // in a fleet: another host -> {models, seenAt}
  let staleMs = 4000;

  function setStatus(text) {
    status.textContent = text;
  }

  const chat = (m) => m.kind !== "embeddings" && !m.hidden && m.state !== "failed";
  const name = (m) => m.alias || m.id;

  function onSnapshot(s) {
    here = (s.models || []).filter(chat);
    refresh();
  }

  function onRecord(host, snapshot, seenAt) {
    if (typeof host !== "string" || host === cfg.host || !snapshot) return;
    elsewhere.set(host, { models: (snapshot.models || []).filter(chat), seenAt });
  }

  // chat models from the snapshot, then those only other live hosts have; the choice survives updates
  function refresh() {
    const options = here.map((m) => [name(m), name(m) + (m.state === "loaded" ? "" : " (" + m.state + ")")]);
    const offered = new Set(options.map(([value]) => value));
    const now = performance.now();
    for (const [host, h] of [...elsewhere].sort((a, b) => a[0].localeCompare(b[0]))) {
      if (now - h.seenAt > staleMs) continue;
      for (const m of h.models) {
        if (offered.has(name(m))) continue;
        offered.add(name(m));
        options.push([name(m), name(m) + " (on " + host + (m.state === "loaded" ? "" : ", " + m.state) + ")"]);
      }
    }
    const have = [...select.options].map((o) => o.value + "\t" + o.text);
    if (options.map((o) => o.join("\t")).join("\n") === have.join("\n")) return;
    const chosen = select.value;
    select.textContent = "";
    for (const [value, text] of options) select.add(new Option(text, value));
    if (options.some(([value]) => value === chosen)) select.value = chosen;
  }

  function onMessage(msg) {
    if (msg.type === "snapshot") onSnapshot(msg);
    else if (msg.type === "fleet.host" && msg.record) {
      onRecord(msg.record.host, msg.record.snapshot, performance.now());
      refresh();
    } else if (msg.type === "fleet") {
      if (msg.stale_seconds > 0) staleMs = msg.stale_seconds * 1000;
      elsewhere.clear();
      const now = performance.now();
      for (const h of msg.hosts || []) onRecord(h.host, h.snapshot, now - (h.age_seconds || 0) * 1000);
      refresh();
    }
  }

  function findMine() {
    if (!mine || !C) return null;
    return (mine.requestId && C.trace(mine.requestId)) || null;
  }

  function showMine() {
    const t = findMine();
    const box = $("pg-trace");
    if (!t) return;
    box.hidden = false;
    C.render(box, t, C.fmt);
  }

  async function send(ev) {
    ev.preventDefault();
    if (controller) return;
    const prompt = $("pg-prompt").value.trim();
    if (!prompt || !select.value) return;
    controller = new AbortController();
    $("pg-send").disabled = true;
    $("pg-stop").disabled = false;
    $("pg-trace").hidden = true;
    out.textContent = "";
    out.dataset.state = "waiting";
    mine = { requestId: null, completionId: null };
    setStatus("waiting for " + select.value + "…");
    const body = { model: select.value, messages: [{ role: "user", content: prompt }], stream: true,
                   max_tokens: Number($("pg-max").value) || 128, stream_options: { include_usage: true } };
    try {
      const r = await fetch("/v1/chat/completions", {
        method: "POST", credentials: "same-origin", signal: controller.signal, body: JSON.stringify(body),
        headers: { "Content-Type": "application/json", "X-CSRFToken": C ? C.csrf() : "", Accept: "text/event-stream" },
      });
      mine.requestId = r.headers.get("x-omlx-request-id");
      if (!r.ok) {
        const err = await r.json().catch(() => ({}));
        throw new Error(((err.error || {}).message) || "HTTP " + r.status);
      }
      await read(r.body.getReader());
      out.dataset.state = "done";
    } catch (e) {
      out.dataset.state = e.name === "AbortError" ? "stopped" : "error";
      setStatus(e.name === "AbortError" ? "stopped" : "error: " + e.message);
    } finally {
      controller = null;
      $("pg-send").disabled = false;
      $("pg-stop").disabled = true;
      showMine();
    }
  }

  async function read(reader) {
    const decoder = new TextDecoder();
    let buf = "";
    let tokens = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (line.startsWith(": ") && line !== ": keep-alive") setStatus(line.slice(2));   // a load's progress
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") {
            setStatus("done · " + tokens + " tokens");
            continue;
          }
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || "the stream failed");
          mine.completionId = mine.completionId || chunk.id;
          const delta = ((chunk.choices || [])[0] || {}).delta || {};
          if (delta.content) {
            out.dataset.state = "streaming";
            out.textContent += delta.content;
            tokens += 1;
            setStatus("streaming · " + tokens + " chunks");
          }
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
        }
      }
    }
    if (out.dataset.state === "waiting") setStatus("ended without an answer");
  }

  form.addEventListener("submit", send);
  $("pg-stop").addEventListener("click", () => controller && controller.abort());
  if (C) C.onRequests(() => showMine());

  window.omlxPlayground = { onMessage, get mine() { return mine; } };
})();
