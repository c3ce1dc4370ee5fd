// The chat page's OpenAI client: fetch() with the user's API key (a 401 asks for one and tries again),
// the message of the server's error envelope, and an answer streamed from /v1/chat/completions
// (fetch + a stream reader, server-sent events parsed here) into a message view.
//
// Nothing here touches the page: what arrives goes to the view's methods as plain strings.

export class ServerError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The message of the server's OpenAI error envelope, or the status line.
export async function errorMessage(response) {
  let text = "";
  try {
    text = await response.text();
  } catch (_) { /* the body is lost: the status line says enough */ }
  try {
    const body = JSON.parse(text);
    if (body && body.error && typeof body.error.message === "string") return body.error.message;
  } catch (_) { /* not JSON */ }
  const status = `${response.status} ${response.statusText}`.trim();
  return text ? `${status}: ${text.slice(0, 300)}` : status;
}

// The API as the page calls it. `keys` says where the API key comes from: keys.stored() is the key ("" for
// none) and keys.ask(message) asks the user after a 401 with `message`, resolving true once a key was entered.
export function apiClient(keys) {
  // fetch() with the API key; a 401 asks for a key and tries again.
  async function apiFetch(path, options) {
    for (;;) {
      const headers = {};
      if (options.body !== undefined) headers["Content-Type"] = "application/json";
      const key = keys.stored();
      if (key) headers.Authorization = `Bearer ${key}`;
      const response = await fetch(path, { ...options, headers, cache: "no-store" });
      if (response.status !== 401) return response;
      const message = await errorMessage(response);
      if (!(await keys.ask(message))) throw new ServerError(401, message);
    }
  }

  // Stream the answer to request `body` into `view` (see handleEvent); resolves at [DONE], throws on a failed
  // request, a stream cut before [DONE], or (AbortError) `signal` aborting the fetch.
  async function streamAnswer(body, signal, view) {
    const response = await apiFetch("/v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal });
    if (!response.ok) throw new ServerError(response.status, await errorMessage(response));
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const sse = new SSEReader();
    for (;;) {
      const { value, done } = await reader.read();
      const text = done ? decoder.decode() : decoder.decode(value, { stream: true });
      for (const data of sse.push(text)) {
        if (handleEvent(data, view)) {
          reader.cancel().catch(() => {});
          return;
        }
      }
      if (done) throw new Error("The answer was cut off: the stream ended before [DONE].");
    }
  }

  return { fetch: apiFetch, streamAnswer };
}

// An incremental reader of the SSE format: push() text as it arrives, get back the
// `data` of each completed event. Comments and other fields are skipped.
class SSEReader {
  constructor() {
    this.pending = "";
    this.data = [];
  }

  push(text) {
    let buffer = this.pending + text;
    // A CR at the very end may be the first half of a CRLF: keep it for the next push.
    const heldCR = buffer.endsWith("\r");
    if (heldCR) buffer = buffer.slice(0, -1);
    const lines = buffer.split(/\r\n|\r|\n/);
    this.pending = lines.pop() + (heldCR ? "\r" : "");
    const events = [];
    for (const line of lines) {
      if (line === "") {
        if (this.data.length) events.push(this.data.join("\n"));
        this.data = [];
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "data") this.data.push(value);
      }
    }
    return events;
  }
}

// Handle one SSE event; true once the stream is complete ([DONE]). The view takes the pieces of choice 0:
// reasoning(text), content(text), finish(reason), usage(object), and fail(message) for an error event.
function handleEvent(data, view) {
  if (data === "[DONE]") return true;
  let chunk;
  try {
    chunk = JSON.parse(data);
  } catch (_) {
    view.fail(`The server sent an event that is not JSON: ${data.slice(0, 200)}`);
    return false;
  }
  if (chunk.error) {
    view.fail(typeof chunk.error.message === "string" ? chunk.error.message : "The server reported an error.");
    return false;
  }
  for (const choice of chunk.choices || []) {
    if ((choice.index ?? 0) !== 0) continue; // the page asks for one choice
    const delta = choice.delta || {};
    if (typeof delta.reasoning_content === "string" && delta.reasoning_content) view.reasoning(delta.reasoning_content);
    if (typeof delta.content === "string" && delta.content) view.content(delta.content);
    if (choice.finish_reason) view.finish(choice.finish_reason);
  }
  if (chunk.usage) view.usage(chunk.usage);
  return false;
}
