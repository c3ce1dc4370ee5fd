// The kestrel-trio chat page: plain JavaScript (ES modules), no build step, no remote loads.
//
// It is an OpenAI client like any other: it reads the model id (and the sampling defaults a
// request that leaves a field out gets, shown as the settings' placeholders) from /v1/models and
// streams answers from /v1/chat/completions (fetch + a stream reader, SSE parsed in api.js),
// sending the whole conversation each turn. Stop aborts the fetch; the server sees the
// connection close and cancels the generation.
//
// Everything the server sends (model output, reasoning, error messages, the model
// id) is put into the page as text (text nodes, textContent), never as HTML: nothing
// in this file or the modules it imports parses a string as markup
// (tests/server/test_webui_files.py checks every script the page serves).
//
// This file holds the page's state, the API key, the settings, attachments and one turn of the
// conversation, and wires them to the page; api.js talks to the server, messages.js draws the messages.

import { apiClient, errorMessage, ServerError } from "./api.js";
import { element, isVideo, mediaElement, MessageList } from "./messages.js";

const KEY_STORE = "kestrel-trio.api-key";
const SETTINGS_STORE = "kestrel-trio.settings";
const IMAGE_TYPES = "image/png,image/jpeg,image/webp";
const VIDEO_TYPES = "video/mp4,video/webm,video/quicktime";

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"), newChat: $("new-chat"), settingsToggle: $("settings-toggle"), settings: $("settings"),
  systemPrompt: $("system-prompt"), temperature: $("temperature"), topP: $("top-p"), maxTokens: $("max-tokens"),
  forgetKey: $("forget-key"), messages: $("messages"), empty: $("empty"), notice: $("notice"),
  composer: $("composer"), prompt: $("prompt"), attachments: $("attachments"), attachLabel: $("attach-label"),
  attach: $("attach"), send: $("send"), stop: $("stop"), keyDialog: $("key-dialog"), keyForm: $("key-form"),
  keyError: $("key-error"), apiKey: $("api-key"), rememberKey: $("remember-key"), keyCancel: $("key-cancel"),
};

const state = {
  model: null,        // the served model's id, from /v1/models
  takesImages: false, // the model's card lists "image" in input_modalities (Qwen3-VL)
  takesVideo: false,  // ... and "video" (Qwen3-VL on a server with PyAV)
  history: [],        // the conversation as OpenAI messages (the system prompt is added per request)
  conversation: 0,    // bumped by New chat: an answer still ending then belongs to the old one
  controller: null,   // the AbortController of the answer being streamed
  images: [],         // data: URLs of images (and videos) attached to the next message
  keyPrompt: null,    // the pending API-key question, shared by concurrent requests
};

const chat = new MessageList(ui.messages, ui.empty);
const api = apiClient({ stored: storedKey, ask: askForKey });

function showNotice(message) {
  ui.notice.textContent = message;
  ui.notice.hidden = !message;
}

// -- API key ------------------------------------------------------------

function storedKey() {
  return sessionStorage.getItem(KEY_STORE) || localStorage.getItem(KEY_STORE) || "";
}

function storeKey(key, remember) {
  sessionStorage.setItem(KEY_STORE, key);
  if (remember) localStorage.setItem(KEY_STORE, key);
  else localStorage.removeItem(KEY_STORE);
  ui.forgetKey.hidden = false;
}

function forgetKey() {
  sessionStorage.removeItem(KEY_STORE);
  localStorage.removeItem(KEY_STORE);
  ui.forgetKey.hidden = true;
}

// Ask for a key (the server said 401 with `message`); resolves true once one was entered.
function askForKey(message) {
  if (state.keyPrompt) return state.keyPrompt;
  state.keyPrompt = new Promise((resolve) => {
    const finish = (entered) => {
      ui.keyForm.removeEventListener("submit", onSubmit);
      ui.keyCancel.removeEventListener("click", onCancel);
      ui.keyDialog.removeEventListener("cancel", onCancel);
      if (ui.keyDialog.open) ui.keyDialog.close();
      state.keyPrompt = null;
      resolve(entered);
    };
    const onSubmit = (event) => {
      event.preventDefault();
      const key = ui.apiKey.value.trim();
      if (!key) return;
      storeKey(key, ui.rememberKey.checked);
      finish(true);
    };
    const onCancel = (event) => {
      event.preventDefault();
      finish(false);
    };
    ui.keyError.textContent = message;
    ui.keyError.hidden = !message;
    ui.apiKey.value = "";
    ui.keyForm.addEventListener("submit", onSubmit);
    ui.keyCancel.addEventListener("click", onCancel);
    ui.keyDialog.addEventListener("cancel", onCancel);
    ui.keyDialog.showModal();
    ui.apiKey.focus();
  });
  return state.keyPrompt;
}

// -- the model ----------------------------------------------------------

async function loadModel() {
  try {
    const response = await api.fetch("/v1/models", { method: "GET" });
    if (!response.ok) throw new ServerError(response.status, await errorMessage(response));
    const listing = await response.json();
    const card = listing && Array.isArray(listing.data) ? listing.data[0] : null;
    if (!card || typeof card.id !== "string") throw new Error("the server lists no model");
    state.model = card.id;
    state.takesImages = Array.isArray(card.input_modalities) && card.input_modalities.includes("image");
    state.takesVideo = state.takesImages && card.input_modalities.includes("video");
    ui.attach.accept = IMAGE_TYPES + (state.takesVideo ? "," + VIDEO_TYPES : "");
    ui.attachLabel.title = state.takesVideo ? "attach images (PNG, JPEG, WebP) or a short video (MP4, WebM)"
      : "attach images (PNG, JPEG, WebP)";
    showDefaults(card.sampling_defaults);
    ui.model.textContent = card.id;
    ui.attachLabel.hidden = !state.takesImages;
    showNotice("");
    document.body.dataset.model = "ready";
  } catch (error) {
    ui.model.textContent = "no model";
    showNotice(`Could not read the model list: ${error.message}`);
    document.body.dataset.model = "failed";
  }
}

// The server's defaults as each empty setting's placeholder (and tooltip): what a request that leaves the
// field out gets. max_tokens null means the answer may run to the end of the context.
function showDefaults(defaults) {
  if (!defaults || typeof defaults !== "object") return;
  const unbounded = defaults.max_tokens === null;
  const shown = [
    [ui.temperature, defaults.temperature], [ui.topP, defaults.top_p],
    [ui.maxTokens, unbounded ? "context" : defaults.max_tokens],
  ];
  for (const [input, value] of shown) {
    if (value === undefined) continue;
    input.placeholder = String(value);
    input.title = `server default: ${unbounded && input === ui.maxTokens ? "up to the end of the context" : value}`;
  }
}

// -- one turn -----------------------------------------------------------

function requestBody() {
  const messages = [];
  if (ui.systemPrompt.value.trim()) messages.push({ role: "system", content: ui.systemPrompt.value });
  messages.push(...state.history);
  const body = { model: state.model, messages, stream: true, stream_options: { include_usage: true } };
  const temperature = Number.parseFloat(ui.temperature.value);
  if (Number.isFinite(temperature)) body.temperature = temperature;
  const topP = Number.parseFloat(ui.topP.value);
  if (Number.isFinite(topP)) body.top_p = topP;
  const maxTokens = Number.parseInt(ui.maxTokens.value, 10);
  if (Number.isFinite(maxTokens)) body.max_tokens = maxTokens;
  return body;
}

function setBusy(busy) {
  ui.send.disabled = busy;
  ui.stop.disabled = !busy;
  document.body.dataset.busy = busy ? "true" : "false";
}

async function send() {
  if (state.controller) return; // one answer at a time
  const text = ui.prompt.value;
  const images = state.images;
  if (!text.trim() && !images.length) return;
  if (!state.model) await loadModel();
  if (!state.model) return;
  const content = images.length
    ? [...images.map(mediaPart), ...(text.trim() ? [{ type: "text", text }] : [])]
    : text;
  const question = chat.user(text, images);
  const conversation = state.conversation;
  state.history.push({ role: "user", content });
  ui.prompt.value = "";
  clearAttachments();
  showNotice("");

  const view = chat.assistant(state.model || "assistant");
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  let outcome = "done";
  try {
    await api.streamAnswer(requestBody(), controller.signal, view);
  } catch (error) {
    if (error.name === "AbortError") {
      outcome = "stopped";
    } else {
      view.fail(error.message);
    }
  } finally {
    state.controller = null;
    setBusy(false);
  }
  view.end(outcome);
  if (conversation !== state.conversation) return; // New chat was clicked meanwhile
  if (view.text) {
    state.history.push({ role: "assistant", content: view.text });
  } else {
    // Nothing came back: this turn is not part of the conversation; a failed one can be sent again.
    state.history.pop();
    question.classList.add("dropped");
    question.title = "not part of the conversation: no answer came back";
    if (view.failed && !ui.prompt.value) ui.prompt.value = text;
  }
  ui.prompt.focus();
}

function stop() {
  if (state.controller) state.controller.abort();
}

function newChat() {
  stop();
  state.conversation += 1;
  state.history = [];
  chat.clear();
  showNotice("");
  ui.prompt.focus();
}

// -- images and videos --------------------------------------------------

// A video file goes as vLLM's video_url part; the server samples its frames.
function mediaPart(url) {
  return isVideo(url) ? { type: "video_url", video_url: { url } } : { type: "image_url", image_url: { url } };
}

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attachFiles() {
  const files = [...ui.attach.files];
  ui.attach.value = "";
  for (const file of files) {
    try {
      state.images.push(await readAsDataURL(file));
    } catch (error) {
      showNotice(`Could not read ${file.name}: ${error.message}`);
    }
  }
  showAttachments();
}

function showAttachments() {
  ui.attachments.replaceChildren();
  state.images.forEach((url, index) => {
    const item = element("div", "attachment");
    const media = mediaElement(url, `${isVideo(url) ? "video" : "image"} ${index + 1}`);
    const remove = element("button", "remove", "×");
    remove.type = "button";
    remove.title = isVideo(url) ? "remove this video" : "remove this image";
    remove.addEventListener("click", () => {
      state.images.splice(index, 1);
      showAttachments();
    });
    item.append(media, remove);
    ui.attachments.append(item);
  });
  ui.attachments.hidden = state.images.length === 0;
}

function clearAttachments() {
  state.images = [];
  showAttachments();
}

// -- settings -----------------------------------------------------------

function loadSettings() {
  try {
    const saved = JSON.parse(localStorage.getItem(SETTINGS_STORE) || "{}");
    if (typeof saved.systemPrompt === "string") ui.systemPrompt.value = saved.systemPrompt;
    if (typeof saved.temperature === "string") ui.temperature.value = saved.temperature;
    if (typeof saved.topP === "string") ui.topP.value = saved.topP;
    if (typeof saved.maxTokens === "string") ui.maxTokens.value = saved.maxTokens;
  } catch (_) { /* unreadable settings: keep the defaults */ }
}

function saveSettings() {
  localStorage.setItem(SETTINGS_STORE, JSON.stringify({
    systemPrompt: ui.systemPrompt.value, temperature: ui.temperature.value, topP: ui.topP.value,
    maxTokens: ui.maxTokens.value,
  }));
}

function toggleSettings() {
  ui.settings.hidden = !ui.settings.hidden;
  ui.settingsToggle.setAttribute("aria-expanded", String(!ui.settings.hidden));
}

// -- wiring -------------------------------------------------------------

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
ui.stop.addEventListener("click", stop);
ui.newChat.addEventListener("click", newChat);
ui.settingsToggle.addEventListener("click", toggleSettings);
ui.forgetKey.addEventListener("click", forgetKey);
ui.attach.addEventListener("change", attachFiles);
for (const input of [ui.systemPrompt, ui.temperature, ui.topP, ui.maxTokens]) {
  input.addEventListener("change", saveSettings);
}

loadSettings();
ui.forgetKey.hidden = !storedKey();
setBusy(false);
loadModel();
