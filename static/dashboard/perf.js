/* Per-model latency and throughput: one small uPlot chart per model over the finished requests the
   console holds (time to first token and total on the left axis, decode tokens per second on the
   right), with a line of medians. Redrawn as the websocket's requests messages arrive. */
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
  const charts = new Map();     // model -> {box, plot, note}
  let queued = false;
  let latest = null;

  const median = (xs) => {
    const v = xs.filter((x) => x != null).sort((a, b) => a - b);
    return v.length ? v[Math.floor((v.length - 1) / 2)] : null;
  };

  // "12 requests · TTFT p50 85 ms · 41.2 tok/s · 1 error" over the requests the chart shows
  function summaryText(list) {
    const parts = [list.length + (list.length === 1 ? " request" : " requests")];
    const ttft = median(list.map((t) => t.ttft));
    if (ttft != null) parts.push("TTFT p50 " + Math.round(ttft * 1000) + " ms");
    const tps = median(list.map((t) => t.tps));
    if (tps != null) parts.push(tps.toFixed(1) + " tok/s p50");
    const errors = list.filter((t) => t.status === "error").length;
    if (errors) parts.push(errors + (errors === 1 ? " error" : " errors"));
    return parts.join(" · ");
  }

  function chartFor(model) {
    let c = charts.get(model);
    if (c) return c;
    const box = document.createElement("div");
    box.className = "perf-model";
    box.dataset.model = model;
    const h = document.createElement("h3");
    h.textContent = model;
    const note = document.createElement("p");
    note.className = "muted small perf-note";
    const area = document.createElement("div");
    area.className = "perf-chart";
    box.append(h, note, area);
    $("perf").appendChild(box);
    let plot = null;
    if (typeof uPlot !== "undefined") {
      const secs = (u, v) => (v == null ? "–" : v < 1 ? Math.round(v * 1000) + " ms" : v.toFixed(2) + " s");
      plot = new uPlot({
        width: Math.max(240, area.clientWidth || 320), height: 150,
        scales: { x: { time: true }, tps: { range: (u, min, max) => [0, Math.max(1, max || 0) * 1.1] } },
        axes: [{}, { values: (u, t) => t.map((v) => secs(u, v)), size: 70 },
               { scale: "tps", side: 1, grid: { show: false }, values: (u, t) => t.map((v) => v.toFixed(0)), size: 40 }],
        series: [{}, { label: "TTFT", stroke: "#7c3aed", width: 1.5, points: { show: true }, value: secs },
                 { label: "total", stroke: "#2563eb", width: 1.5, points: { show: true }, value: secs },
                 { label: "tok/s", scale: "tps", stroke: "#16a34a", width: 1.5, points: { show: true },
                   value: (u, v) => (v == null ? "–" : v.toFixed(1)) }],
        cursor: { drag: { x: false, y: false } },
      }, [[], [], [], []], area);
    } else {
      area.textContent = "The chart library did not load.";
    }
    c = { box, plot, note };
    charts.set(model, c);
    return c;
  }

  function draw() {
    queued = false;
    if (!latest) return;
    const byModel = new Map();
    for (const t of latest.traces.values()) {
      if (!t.model || t.ended == null) continue;
      if (!byModel.has(t.model)) byModel.set(t.model, []);
      byModel.get(t.model).push(t);
    }
    for (const [model, list] of byModel) {
      list.sort((a, b) => a.ended - b.ended);
      const c = chartFor(model);
      c.note.textContent = summaryText(list);
      if (!c.plot) continue;
      const xs = list.map((t) => t.ended);
      c.plot.setData([xs, list.map((t) => t.ttft), list.map((t) => t.total), list.map((t) => t.tps)]);
      // at least the last minute: one request is a point in a minute, not in years
      const last = xs[xs.length - 1];
      c.plot.setScale("x", { min: Math.min(xs[0], last - 60), max: last + 5 });
    }
    $("perf-empty").hidden = charts.size > 0;
  }

  function onRequests(state) {
    latest = state;
    if (!queued) {
      queued = true;
      requestAnimationFrame(draw);
    }
  }

  if (window.omlxConsole) window.omlxConsole.onRequests(onRequests);
})();
