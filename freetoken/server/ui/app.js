// The status page: polls GET /v1/freetoken/status every POLL_MS and redraws; the resize form
// posts to /v1/freetoken/memory. Text goes into the DOM through textContent only.
"use strict";

const POLL_MS = 1000;

function setText(id, text) {
  document.getElementById(id).textContent = text;
}

function fillTable(tbody, rows) {
  while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
  for (const cells of rows) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      td.textContent = cell === null || cell === undefined ? "-" : String(cell);
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
}

function pct(v) {
  return v === null || v === undefined ? "-" : (100 * v).toFixed(1) + "%";
}

function showRequests(s) {
  const t = s.totals;
  setText("requests-finished", t.requests_finished);
  setText("requests-running", t.running);
  setText("requests-waiting", t.waiting);
  setText("generation-tokens", t.generation_tokens);
  setText("cached-tokens", t.cached_tokens);
  const last = s.recent.length ? s.recent[s.recent.length - 1] : null;
  setText("last-ttft", last ? fmt(last.ttft_s) : "-");
  setText("last-decode", last ? fmt(last.decode_tok_s) : "-");
  lineChart(document.getElementById("chart-decode"), s.recent.map((r) => ({ x: r.seq, y: r.decode_tok_s })), "#2563eb");
  lineChart(document.getElementById("chart-ttft"), s.recent.map((r) => ({ x: r.seq, y: r.ttft_s })), "#db2777");
}

function showCache(c) {
  const summary = document.getElementById("cache-summary");
  document.getElementById("resize-form").hidden = !c;  // nothing to resize on resident experts
  if (!c) {
    summary.textContent = "no offloaded MoE runtime (resident backend): no expert cache to show or resize";
    layerChart(document.getElementById("chart-layers"), []);
    for (const id of ["cache-slots", "cache-hit-rate", "cache-split"]) setText(id, "-");
    return;
  }
  // what the misses so far did (the per-layer counters), next to the split the runtime aims at
  const misses = c.layers.reduce((n, l) => n + l.misses, 0);
  const filled = misses ? c.layers.reduce((n, l) => n + l.fills, 0) / misses : null;
  summary.textContent = c.backend + " backend, " + c.policy + " policy on " + c.device + ": " +
    c.slots + " of " + c.total_experts + " experts cached (" + fmtBytes(c.bytes) + "), hit rate " +
    pct(c.hit_rate) + ", misses filled " + pct(filled) + " (the rest ran on the CPU), target q/m " +
    pct(c.split_ratio) +
    (c.pending_resize_bytes ? ", resize to " + fmtBytes(c.pending_resize_bytes) + " pending" : "");
  setText("cache-slots", c.slots);
  setText("cache-hit-rate", pct(c.hit_rate));
  setText("cache-split", pct(filled));
  layerChart(document.getElementById("chart-layers"), c.layers);
}

function showMemory(m) {
  const kvFree = m.kv_bytes === null ? null : m.kv_bytes - m.kv_used_bytes;
  const parts = [
    { label: "KV pages in use", bytes: m.kv_used_bytes, color: "#2563eb" },
    { label: "KV pages free", bytes: kvFree, color: "#bfdbfe" },
    { label: "expert slots", bytes: m.expert_cache_bytes, color: "#10b981" },
    { label: "checkpoints (device)", bytes: m.checkpoint_device_bytes, color: "#f59e0b" },
    { label: "checkpoints (host)", bytes: m.checkpoint_host_bytes, color: "#fcd34d" },
  ];
  memoryBar(document.getElementById("chart-memory"), parts, document.getElementById("memory-legend"));
  const pages = m.kv_pages_total === null ? "" : " (" + (m.kv_pages_total - m.kv_pages_free) + " of " + m.kv_pages_total + " pages)";
  const cps = (n) => (n === null ? "" : " (" + n + ")");
  fillTable(document.querySelector("#memory-table tbody"), [
    ["KV pages", fmtBytes(m.kv_used_bytes) + " of " + fmtBytes(m.kv_bytes) + pages],
    ["expert slots", fmtBytes(m.expert_cache_bytes)],
    ["checkpoints on the device", fmtBytes(m.checkpoint_device_bytes) + cps(m.checkpoints_device)],
    ["checkpoints on the host", fmtBytes(m.checkpoint_host_bytes) + cps(m.checkpoints_host)],
  ]);
}

function showSessions(s) {
  fillTable(document.querySelector("#harness-table tbody"), s.harnesses.map((h) =>
    [h.harness, h.sessions, h.requests, h.reused_tokens, h.recomputed_tokens]));
  fillTable(document.querySelector("#session-table tbody"), s.sessions.map((x) => [
    x.id, x.harness_title, x.requests, x.reused_tokens,
    x.checkpoints === null ? "-" : x.checkpoints.map((c) => c.depth + ": " + c.kind).join(", ") || "none",
  ]));
}

async function poll() {
  try {
    const s = await callJson("/v1/freetoken/status");
    setText("model", s.model);
    const health = document.getElementById("health");
    health.textContent = s.healthy ? "healthy" : "unhealthy";
    health.className = "badge " + (s.healthy ? "ok" : "bad");
    showRequests(s);
    showCache(s.expert_cache);
    showMemory(s.memory);
    showSessions(s);
    setText("status-time", new Date(s.time * 1000).toLocaleTimeString());
    document.getElementById("error").hidden = true;
  } catch (err) {
    const box = document.getElementById("error");
    box.textContent = "status: " + err.message;
    box.hidden = false;
    const health = document.getElementById("health");
    const loading = err.code === "model_loading";  // the server answers; the model is not ready
    health.textContent = loading ? "loading" : "unreachable";
    health.className = "badge " + (loading ? "busy" : "bad");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function setupResize() {
  document.getElementById("resize-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const out = document.getElementById("resize-result");
    const value = document.getElementById("resize-input").value.trim();
    out.textContent = "resizing...";
    try {
      const r = (await callJson("/v1/freetoken/memory", { expert_cache: value })).expert_cache;
      out.textContent = "expert cache: " + r.old_slots + " -> " + r.slots + " slots (" + fmtBytes(r.bytes) + "), kept " + r.kept;
    } catch (err) {
      out.textContent = "error: " + err.message;
    }
  });
}

const keyInput = document.getElementById("api-key");
keyInput.value = sessionStorage.getItem("freetoken-api-key") || "";
keyInput.addEventListener("change", () => sessionStorage.setItem("freetoken-api-key", keyInput.value));
document.getElementById("key-form").addEventListener("submit", (event) => event.preventDefault());
setupResize();
setupChat();
poll();
