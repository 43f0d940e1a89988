// The chat page: a conversation with the served model through POST /v1/chat/completions
// (streamed as server-sent events), images and videos attached by file picker, drag-and-drop or
// paste.
// Replies are rendered as Markdown by markdown-it with raw HTML off: nothing the model writes
// becomes markup, and its Markdown images are not rendered (no request leaves for another host).
const $ = (id) => document.getElementById(id);

const SETTINGS_KEY = "vlm.settings";
const API_KEY_KEY = "vlm.apiKey";
const DEFAULTS = {
  system: "", temperature: 0.7, top_p: 0.95, max_tokens: 512, seed: "",
  min_pixels: "", max_pixels: "", extra: "",
};

const md = window.markdownit({ html: false, linkify: false, breaks: true });
md.disable("image");
const renderLinkOpen = md.renderer.rules.link_open ||
  ((tokens, idx, options, env, self) => self.renderToken(tokens, idx, options));
md.renderer.rules.link_open = (tokens, idx, options, env, self) => {
  tokens[idx].attrSet("target", "_blank");
  tokens[idx].attrSet("rel", "noopener noreferrer");
  return renderLinkOpen(tokens, idx, options, env, self);
};

let settings = loadSettings();
let apiKey = localStorage.getItem(API_KEY_KEY) || "";
let model = "";
let conversation = [];  // {role, text, images, videos (data URLs), reasoning, state, stats, error}
let pending = [];       // data URLs attached to the next message (images and videos)

const isVideo = (url) => url.startsWith("data:video/");
let controller = null;  // the request being streamed

class ApiError extends Error {
  constructor(status, message) {
    super(status ? `${status}: ${message}` : message);
    this.status = status;
  }
}

function loadSettings() {
  try {
    return { ...DEFAULTS, ...JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}") };
  } catch {
    return { ...DEFAULTS };
  }
}

function authHeaders() {
  return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

async function errorText(response) {
  const body = await response.text();
  try {
    return JSON.parse(body).error.message;
  } catch {
    return body || response.statusText;
  }
}

async function loadModel() {
  let r;
  try {
    r = await fetch("/v1/models", { headers: authHeaders() });
  } catch (e) {
    showError(`The server cannot be reached: ${e.message}`);
    return;
  }
  if (r.status === 401) {
    showError("This server needs an API key: enter it to chat.");
    askKey();
    return;
  }
  if (r.status === 503) {  // still loading the model
    setTimeout(loadModel, 1000);
    return;
  }
  if (!r.ok) {
    showError(`GET /v1/models failed: ${r.status} ${await errorText(r)}`);
    return;
  }
  const list = await r.json();
  model = list.data?.[0]?.id || "";
  $("model").textContent = model;
  showError("");
}

function askKey() {
  $("api-key").value = apiKey;
  if (!$("key-dialog").open) $("key-dialog").showModal();
}

// The request for the conversation so far (the reply being written is not in it yet).
function requestBody() {
  const messages = [];
  if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
  conversation.forEach((m, i) => {
    // A turn whose reply failed is left out, question and all (roles keep alternating).
    if (m.state === "error" || conversation[i + 1]?.state === "error") return;
    if (m.role === "user") {
      const videos = m.videos ?? [];
      if (m.images.length === 0 && videos.length === 0) {
        messages.push({ role: "user", content: m.text });
        return;
      }
      const parts = m.images.map((url) => {
        const part = { type: "image_url", image_url: { url } };
        if (settings.min_pixels !== "") part.min_pixels = Number(settings.min_pixels);
        if (settings.max_pixels !== "") part.max_pixels = Number(settings.max_pixels);
        return part;
      });
      // A video's pixel budget is over all its frames: the model's own, not the image settings.
      for (const url of videos) parts.push({ type: "video_url", video_url: { url } });
      if (m.text) parts.push({ type: "text", text: m.text });
      messages.push({ role: "user", content: parts });
    } else if (m.text) {
      messages.push({ role: "assistant", content: m.text });
    }
  });
  // Extra fields first, so that they cannot replace the conversation or the streaming.
  const body = settings.extra.trim() ? JSON.parse(settings.extra) : {};
  Object.assign(body, { messages, stream: true, stream_options: { include_usage: true } });
  if (model) body.model = model;
  for (const k of ["max_tokens", "temperature", "top_p", "seed"]) {
    if (String(settings[k]).trim() !== "") body[k] = Number(settings[k]);
  }
  return body;
}

// The data of each server-sent event of a response body.
// The data of each server-sent event of a response body. Leaving the loop early (a break, an
// error) cancels the body, so the server stops the request.
async function* events(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  const dataOf = (event) => event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
    .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        if (dataOf(buf)) yield dataOf(buf);  // a last event without its blank line
        return;
      }
      buf += value;
      for (let m = buf.match(/\r?\n\r?\n/); m; m = buf.match(/\r?\n\r?\n/)) {
        const data = dataOf(buf.slice(0, m.index));
        buf = buf.slice(m.index + m[0].length);
        if (data) yield data;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

async function send() {
  if (controller) return;
  const text = $("prompt").value.trim();
  if (!text && pending.length === 0) return;
  const user = {
    role: "user",
    text,
    images: pending.filter((u) => !isVideo(u)),
    videos: pending.filter(isVideo),
  };
  conversation.push(user);
  let body;
  try {
    body = requestBody();
  } catch (e) {
    conversation.pop();
    showError(`Settings: the extra request fields are not valid JSON (${e.message})`);
    return;
  }
  pending = [];
  renderAttachments();
  $("prompt").value = "";
  renderMessage(user);
  const reply = { role: "assistant", text: "", reasoning: "", state: "streaming", stats: null };
  conversation.push(reply);
  const view = renderMessage(reply);
  controller = new AbortController();
  setBusy(true);
  showError("");
  const t0 = performance.now();
  let tFirst = 0;
  let usage = null;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { ...authHeaders(), "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!r.ok) throw new ApiError(r.status, await errorText(r));
    let complete = false;
    for await (const data of events(r.body)) {
      if (data === "[DONE]") {
        complete = true;
        break;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ApiError(0, chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices?.[0]?.delta;
      if (!delta) continue;
      const piece = delta.content || "";
      const thought = delta.reasoning_content || "";
      if ((piece || thought) && !tFirst) tFirst = performance.now();
      reply.text += piece;
      reply.reasoning += thought;
      scheduleUpdate(reply, view);
    }
    if (!complete) throw new ApiError(0, "the reply was cut off (the stream ended before [DONE])");
    reply.state = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      reply.state = "stopped";
    } else {
      reply.state = "error";
      reply.error = e.message;
      showError(`The request failed: ${e.message}`);
      if (e.status === 401) askKey();
    }
  } finally {
    const tEnd = performance.now();
    const tokens = usage ? usage.completion_tokens : null;
    reply.stats = {
      tokens,
      ttft_ms: tFirst ? tFirst - t0 : null,
      tokens_per_s: tokens > 1 && tFirst && tEnd > tFirst
        ? (tokens - 1) / ((tEnd - tFirst) / 1000) : null,
    };
    controller = null;
    setBusy(false);
    updateMessage(reply, view);
  }
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

function renderMessage(m) {
  $("empty")?.remove();
  const el = document.createElement("div");
  el.className = `msg ${m.role}`;
  if (m.images?.length || m.videos?.length) {
    const thumbs = document.createElement("div");
    thumbs.className = "thumbs";
    for (const url of m.images ?? []) {
      const img = document.createElement("img");
      img.src = url;
      img.alt = "attached image";
      thumbs.append(img);
    }
    for (const url of m.videos ?? []) {
      const video = document.createElement("video");
      video.src = url;
      video.controls = true;
      video.muted = true;
      video.title = "attached video";
      thumbs.append(video);
    }
    el.append(thumbs);
  }
  if (m.role === "assistant") {
    const details = document.createElement("details");
    details.hidden = true;
    details.append(document.createElement("summary"), document.createElement("div"));
    details.querySelector("summary").textContent = "Reasoning";
    el.append(details);
  }
  const content = document.createElement("div");
  content.className = "content";
  if (m.role === "user") content.textContent = m.text;
  el.append(content);
  if (m.role === "assistant") {
    const stats = document.createElement("span");
    stats.className = "stats";
    el.append(stats);
    updateMessage(m, el);
  }
  $("messages").append(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

const updating = new WeakSet();
function scheduleUpdate(m, el) {
  if (updating.has(el)) return;
  updating.add(el);
  setTimeout(() => {
    updating.delete(el);
    updateMessage(m, el);
  }, 50);
}

function updateMessage(m, el) {
  el.dataset.state = m.state;
  el.classList.toggle("error", m.state === "error");
  const content = el.querySelector(".content");
  if (m.state === "error") {
    content.textContent = m.error;
  } else {
    content.innerHTML = md.render(m.text);  // html: false: the model's text is escaped
  }
  const details = el.querySelector("details");
  details.hidden = !m.reasoning;
  details.querySelector("div").textContent = m.reasoning;
  const parts = [];
  if (m.state === "streaming") parts.push("…");
  if (m.state === "stopped") parts.push("stopped");
  if (m.stats) {
    if (m.stats.tokens !== null) parts.push(`${m.stats.tokens} tokens`);
    if (m.stats.ttft_ms !== null) parts.push(`TTFT ${Math.round(m.stats.ttft_ms)} ms`);
    if (m.stats.tokens_per_s !== null) parts.push(`${m.stats.tokens_per_s.toFixed(1)} tok/s`);
    el.dataset.tokens = m.stats.tokens ?? "";
  }
  el.querySelector(".stats").textContent = parts.join(" · ");
  const box = $("messages");
  if (box.scrollHeight - box.scrollTop - box.clientHeight < 80) el.scrollIntoView({ block: "end" });
}

function renderAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  pending.forEach((url, i) => {
    const fig = document.createElement("figure");
    const img = document.createElement(isVideo(url) ? "video" : "img");
    img.src = url;
    if (isVideo(url)) {
      img.muted = true;
      img.title = `video ${i + 1} to send`;
    } else {
      img.alt = `image ${i + 1} to send`;
    }
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "×";
    remove.title = "Remove";
    remove.addEventListener("click", () => {
      pending.splice(i, 1);
      renderAttachments();
    });
    fig.append(img, remove);
    box.append(fig);
  });
}

function addFiles(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/") && !file.type.startsWith("video/")) {
      showError(`${file.name} is not an image or a video`);
      continue;
    }
    const reader = new FileReader();
    reader.onload = () => {
      pending.push(reader.result);
      renderAttachments();
    };
    reader.readAsDataURL(file);
  }
}

function exportConversation() {
  const data = {
    model, exported: new Date().toISOString(), settings,
    messages: conversation.map(({ role, text, images, videos, reasoning, state, stats, error }) =>
      ({ role, text, images, videos, reasoning, state, stats, error })),
  };
  const url = URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)],
    { type: "application/json" }));
  const a = document.createElement("a");
  a.href = url;
  a.download = `vlm-chat-${data.exported.replace(/[:.]/g, "-")}.json`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function openSettings() {
  const form = $("settings-form");
  for (const [k, v] of Object.entries(settings)) {
    if (form.elements[k]) form.elements[k].value = v;
  }
  $("settings-error").hidden = true;
  $("settings").showModal();
}

$("settings-form").addEventListener("submit", (e) => {
  if (e.submitter?.value !== "save") return;
  const form = e.target;
  const next = {};
  for (const k of Object.keys(DEFAULTS)) next[k] = form.elements[k].value;
  try {
    const extra = next.extra.trim() ? JSON.parse(next.extra) : {};
    if (typeof extra !== "object" || extra === null || Array.isArray(extra)) {
      throw new Error("it must be a JSON object");
    }
  } catch (err) {
    e.preventDefault();
    $("settings-error").textContent = `Extra request fields: ${err.message}`;
    $("settings-error").hidden = false;
    return;
  }
  settings = next;
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
});
$("reset-settings").addEventListener("click", () => {
  settings = { ...DEFAULTS };
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
  openSettings();
});
for (const button of document.querySelectorAll("dialog .cancel")) {
  button.addEventListener("click", () => button.closest("dialog").close());
}
$("key-form").addEventListener("submit", (e) => {
  if (e.submitter?.value !== "save") return;
  apiKey = $("api-key").value.trim();
  localStorage.setItem(API_KEY_KEY, apiKey);
  loadModel();
});
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});
$("stop").addEventListener("click", () => controller?.abort());
$("attach").addEventListener("click", () => $("file").click());
$("file").addEventListener("change", (e) => {
  addFiles(e.target.files);
  e.target.value = "";
});
$("open-settings").addEventListener("click", openSettings);
$("export").addEventListener("click", exportConversation);
$("new-chat").addEventListener("click", () => {
  controller?.abort();
  conversation = [];
  $("messages").replaceChildren();
  showError("");
});
document.addEventListener("paste", (e) => {
  const files = [...(e.clipboardData?.files || [])];
  if (files.length) {
    e.preventDefault();
    addFiles(files);
  }
});
document.addEventListener("dragover", (e) => {
  e.preventDefault();
  $("messages").classList.add("dragging");
});
document.addEventListener("dragleave", () => $("messages").classList.remove("dragging"));
document.addEventListener("drop", (e) => {
  e.preventDefault();
  $("messages").classList.remove("dragging");
  addFiles(e.dataTransfer?.files || []);
});

loadModel();
