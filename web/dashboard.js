// The dashboard: polls GET /dashboard/metrics (the registry GET /metrics renders, as JSON) and
// draws the last 15 minutes with Chart.js. Tiles show totals since the server started; charts
// show rates between polls and latency percentiles over the last 30 s. Percentiles come from
// the histogram buckets, interpolated as Prometheus' histogram_quantile does.
const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const REFRESH_MS = Number(query.get("refresh_ms")) || 2000;
const KEEP_MS = 15 * 60 * 1000;
const WINDOW_MS = 30 * 1000;

const samples = [];  // {t: ms since the epoch, m: the metric families}

// Prometheus' histogram_quantile (promql/quantile.go, bucketQuantile) over cumulative bucket
// counts whose last bucket is +Inf: NaN without observations; the highest finite bound when
// the rank falls in +Inf; linear interpolation inside the bucket otherwise (from 0 for the
// first bucket).
export function histogramQuantile(q, bounds, buckets) {
  const total = buckets[buckets.length - 1];
  if (!(total > 0) || bounds.length < 1) return NaN;
  const rank = q * total;
  let b = 0;
  while (b < buckets.length - 1 && buckets[b] < rank) b++;
  if (b === buckets.length - 1) return bounds[bounds.length - 1];
  if (b === 0 && bounds[0] <= 0) return bounds[0];
  const start = b > 0 ? bounds[b - 1] : 0;
  const below = b > 0 ? buckets[b - 1] : 0;
  return start + (bounds[b] - start) * ((rank - below) / (buckets[b] - below));
}

function family(m, name) {
  return m?.[name];
}

// A counter's total over its series, a gauge's value; null when absent.
function scalar(m, name) {
  const f = family(m, name);
  if (!f) return null;
  if (f.type === "counter") return Object.values(f.values).reduce((a, v) => a + (v ?? 0), 0);
  return f.value ?? null;
}

// NVML's gauges are -1 until read (or where a reading is not reported).
function reported(v) {
  return v === null || v < 0 ? null : v;
}

function counterSeries(m, name, label) {
  return family(m, name)?.values?.[label] ?? 0;
}

// Quantile q of histogram `name` since the start (from = null) or between two samples.
function quantile(q, name, to, from = null) {
  const h = family(to, name);
  if (!h) return NaN;
  let before = from ? family(from, name) : null;
  if (before && before.count > h.count) before = null;  // the server restarted in between
  const buckets = h.buckets.map((c, i) => c - (before ? before.buckets[i] : 0));
  return histogramQuantile(q, h.bounds, buckets);
}

// The per-second rate of counter `name` between two samples.
function rate(name, a, b) {
  const dt = (b.t - a.t) / 1000;
  if (!(dt > 0)) return null;
  return Math.max(0, (scalar(b.m, name) - scalar(a.m, name)) / dt);
}

function fmt(v, unit = "", digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (unit === "ms") return `${(v * 1000).toFixed(v < 0.01 ? 2 : 0)} ms`;
  if (unit === "%") return `${v.toFixed(digits)} %`;
  if (unit === "bytes") {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
  }
  if (unit === "s") {
    const s = Math.floor(v);
    return `${Math.floor(s / 3600)}h ${Math.floor(s / 60) % 60}m ${s % 60}s`;
  }
  return Number.isInteger(v) ? `${v}` : v.toFixed(digits);
}

// Tiles: label, how the value is shown, and how it is computed from the newest sample.
const TILES = [
  ["requests", "Requests (all outcomes)", "", (m) => scalar(m, "vlm_requests_total")],
  ["requests_ok", "Requests completed", "", (m) => counterSeries(m, "vlm_requests_total", "ok")],
  ["running", "Running", "", (m) => scalar(m, "vlm_num_requests_running")],
  ["waiting", "Waiting", "", (m) => scalar(m, "vlm_num_requests_waiting")],
  ["generated", "Tokens generated", "", (m) => scalar(m, "vlm_generation_tokens_total")],
  ["prompt", "Prompt tokens", "", (m) => scalar(m, "vlm_prompt_tokens_total")],
  ["ttft_p50", "TTFT p50", "ms", (m) => quantile(0.5, "vlm_time_to_first_token_seconds", m)],
  ["ttft_p99", "TTFT p99", "ms", (m) => quantile(0.99, "vlm_time_to_first_token_seconds", m)],
  ["itl_p50", "Inter-token p50", "ms", (m) => quantile(0.5, "vlm_inter_token_latency_seconds", m)],
  ["itl_p99", "Inter-token p99", "ms", (m) => quantile(0.99, "vlm_inter_token_latency_seconds", m)],
  ["kv_usage", "KV cache in use", "%", (m) => {
    const total = scalar(m, "vlm_kv_cache_blocks_capacity");
    return total ? (100 * scalar(m, "vlm_kv_cache_blocks_used")) / total : null;
  }],
  ["kv_capacity", "KV cache capacity (tokens)", "", (m) => scalar(m, "vlm_kv_cache_tokens_capacity")],
  ["kv_memory", "KV cache memory", "bytes", (m) => scalar(m, "vlm_kv_cache_memory_bytes")],
  ["vision_hit_rate", "Vision cache hit rate", "%", (m) => {
    const hits = scalar(m, "vlm_vision_cache_hits_total");
    const all = hits + scalar(m, "vlm_vision_cache_misses_total");
    return all > 0 ? (100 * hits) / all : null;
  }],
  ["encode_p50", "Vision encode p50", "ms", (m) => quantile(0.5, "vlm_vision_encode_seconds", m)],
  ["rss", "Process RSS", "bytes", (m) => scalar(m, "process_resident_memory_bytes")],
  ["uptime", "Uptime", "s", (m) => {
    const start = scalar(m, "process_start_time_seconds");
    return start ? Date.now() / 1000 - start : null;
  }],
  ["gpu", "GPU", "", (m) => (family(m, "vlm_gpu_memory_total_bytes") ? "present" : "no GPU")],
];

function renderTiles(m) {
  const box = $("tiles");
  if (!box.childElementCount) {
    for (const [key, label] of TILES) {
      const tile = document.createElement("div");
      tile.className = "tile";
      tile.id = `tile-${key}`;
      const l = document.createElement("div");
      l.className = "label";
      l.textContent = label;
      const v = document.createElement("div");
      v.className = "value";
      tile.append(l, v);
      box.append(tile);
    }
  }
  for (const [key, , unit, compute] of TILES) {
    const tile = $(`tile-${key}`);
    let v = compute(m);
    if (key === "gpu" && v === "present") {
      const used = scalar(m, "vlm_gpu_memory_used_bytes");
      const util = scalar(m, "vlm_gpu_utilization_percent");
      const power = scalar(m, "vlm_gpu_power_watts");
      const total = reported(scalar(m, "vlm_gpu_memory_total_bytes"));
      v = `${util >= 0 ? `${util} %` : "–"} · ${fmt(reported(used), "bytes")} / ` +
        `${fmt(total, "bytes")}` + (power >= 0 ? ` · ${power.toFixed(0)} W` : "");
    }
    tile.dataset.value = typeof v === "number" && !Number.isNaN(v) ? String(v) : "";
    tile.querySelector(".value").textContent = typeof v === "number" || v === null ? fmt(v, unit) : v;
  }
}

// Charts: id, title, datasets [label, y axis, value(prev, window, newest)].
const CHARTS = [
  ["requests", "Requests", [
    ["running", "y", (p, w, n) => scalar(n.m, "vlm_num_requests_running")],
    ["waiting", "y", (p, w, n) => scalar(n.m, "vlm_num_requests_waiting")],
  ]],
  ["throughput", "Tokens per second", [
    ["output", "y", (p, w, n) => rate("vlm_generation_tokens_total", p, n)],
    ["prompt", "y", (p, w, n) => rate("vlm_prompt_tokens_total", p, n)],
    ["image", "y", (p, w, n) => rate("vlm_image_tokens_total", p, n)],
  ]],
  ["ttft", "Time to first token (ms, last 30 s)", [
    ["p50", "y", (p, w, n) => 1000 * quantile(0.5, "vlm_time_to_first_token_seconds", n.m, w.m)],
    ["p99", "y", (p, w, n) => 1000 * quantile(0.99, "vlm_time_to_first_token_seconds", n.m, w.m)],
  ]],
  ["itl", "Inter-token latency (ms, last 30 s)", [
    ["p50", "y", (p, w, n) => 1000 * quantile(0.5, "vlm_inter_token_latency_seconds", n.m, w.m)],
    ["p99", "y", (p, w, n) => 1000 * quantile(0.99, "vlm_inter_token_latency_seconds", n.m, w.m)],
  ]],
  ["kv", "KV cache in use (%)", [
    ["blocks in use", "y", (p, w, n) => {
      const total = scalar(n.m, "vlm_kv_cache_blocks_capacity");
      return total ? (100 * scalar(n.m, "vlm_kv_cache_blocks_used")) / total : null;
    }],
  ]],
  ["vision", "Vision encoder (last 30 s)", [
    ["encode p50 (ms)", "y", (p, w, n) => 1000 * quantile(0.5, "vlm_vision_encode_seconds", n.m, w.m)],
    ["cache hit rate (%)", "y1", (p, w, n) => {
      const hits = scalar(n.m, "vlm_vision_cache_hits_total") - scalar(w.m, "vlm_vision_cache_hits_total");
      const misses = scalar(n.m, "vlm_vision_cache_misses_total") - scalar(w.m, "vlm_vision_cache_misses_total");
      return hits + misses > 0 ? (100 * hits) / (hits + misses) : null;
    }],
  ]],
  ["process", "Process", [
    ["CPU (%)", "y", (p, w, n) => {
      const r = rate("process_cpu_seconds_total", p, n);
      return r === null ? null : 100 * r;
    }],
    ["RSS (MiB)", "y1", (p, w, n) => scalar(n.m, "process_resident_memory_bytes") / 2 ** 20],
  ]],
  ["gpu", "GPU", [
    ["utilisation (%)", "y", (p, w, n) => reported(scalar(n.m, "vlm_gpu_utilization_percent"))],
    ["memory used (GiB)", "y1", (p, w, n) => reported(scalar(n.m, "vlm_gpu_memory_used_bytes")) / 2 ** 30],
    ["power (W)", "y1", (p, w, n) => reported(scalar(n.m, "vlm_gpu_power_watts"))],
  ]],
];

const charts = {};
const COLORS = ["#0a66c2", "#e8710a", "#1e8e3e", "#9334e6"];

function makeCharts() {
  for (const [id, title, sets] of CHARTS) {
    const box = document.createElement("div");
    box.className = "chart";
    const h = document.createElement("h3");
    h.textContent = title;
    const canvasBox = document.createElement("div");
    canvasBox.className = "canvas-box";
    const canvas = document.createElement("canvas");
    canvas.id = `chart-${id}`;
    canvasBox.append(canvas);
    box.append(h, canvasBox);
    $("charts").append(box);
    const twoAxes = sets.some((s) => s[1] === "y1");
    charts[id] = {
      box,
      sets,
      chart: new window.Chart(canvas, {
        type: "line",
        data: {
          datasets: sets.map(([label, axis], i) => ({
            label, yAxisID: axis, data: [], borderColor: COLORS[i], backgroundColor: COLORS[i],
            pointRadius: 0, borderWidth: 1.5, spanGaps: false,
          })),
        },
        options: {
          animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
          normalized: true,
          plugins: { legend: { labels: { boxWidth: 12 } } },
          scales: {
            x: { type: "linear", ticks: { maxTicksLimit: 6, callback: (v) => new Date(v).toLocaleTimeString() } },
            y: { beginAtZero: true },
            ...(twoAxes ? { y1: { beginAtZero: true, position: "right", grid: { drawOnChartArea: false } } } : {}),
          },
        },
      }),
    };
  }
}

function updateCharts() {
  const n = samples[samples.length - 1];
  const prev = samples.length > 1 ? samples[samples.length - 2] : null;
  const win = samples.find((s) => s.t >= n.t - WINDOW_MS) || samples[0];
  const hasGpu = !!family(n.m, "vlm_gpu_memory_total_bytes");
  for (const [id, { box, sets, chart }] of Object.entries(charts)) {
    if (id === "gpu" && !hasGpu) {  // a CPU server: say so instead of empty axes
      if (!box.querySelector(".none")) {
        const none = document.createElement("div");
        none.className = "none";
        none.textContent = "no GPU: this server runs on the CPU";
        box.querySelector(".canvas-box").hidden = true;
        box.append(none);
      }
      continue;
    }
    sets.forEach(([, , value], i) => {
      let y = prev ? value(prev, win, n) : null;
      if (typeof y !== "number" || !Number.isFinite(y)) y = null;
      const data = chart.data.datasets[i].data;
      data.push({ x: n.t, y });
      while (data.length && data[0].x < n.t - KEEP_MS) data.shift();
    });
    chart.update("none");
  }
}

async function poll() {
  try {
    const r = await fetch("/dashboard/metrics", { cache: "no-store" });
    if (!r.ok) throw new Error(`${r.status} ${r.statusText}`);
    const { metrics } = await r.json();
    samples.push({ t: Date.now(), m: metrics });
    while (samples.length && samples[0].t < Date.now() - KEEP_MS) samples.shift();
    const label = family(metrics, "vllm:num_requests_running")?.labels || "";
    $("model").textContent = (label.match(/model_name="((?:[^"\\]|\\.)*)"/) || [])[1] || "";
    renderTiles(metrics);
    updateCharts();
    $("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
    $("error").hidden = true;
  } catch (e) {
    $("error").textContent = `Cannot read the server's metrics: ${e.message}`;
    $("error").hidden = false;
  } finally {
    setTimeout(poll, REFRESH_MS);
  }
}

makeCharts();
poll();
