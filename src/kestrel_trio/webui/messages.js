// The conversation as the page shows it: the user's messages (text, attached images and videos) and the
// assistant's, growing as the answer streams (reasoning in a fold apart from the answer, then the token
// counts and speed), kept in view while the reader is at the bottom of the page.
//
// Every string goes into the page as text (text nodes, textContent), never as HTML.

// A new element with an optional class and text.
export function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function isVideo(url) {
  return url.startsWith("data:video/");
}

// An <img>, or a muted <video> player, showing the data: URL `url`; `label` is its alt text or title.
export function mediaElement(url, label) {
  const media = element(isVideo(url) ? "video" : "img");
  media.src = url;
  if (isVideo(url)) {
    media.muted = true;
    media.controls = true;
    media.title = label;
  } else {
    media.alt = label;
  }
  return media;
}

function nearBottom() {
  const page = document.scrollingElement;
  return page.scrollHeight - page.scrollTop - page.clientHeight < 80;
}

function keepBottom(wasNearBottom) {
  if (wasNearBottom) window.scrollTo(0, document.scrollingElement.scrollHeight);
}

// The messages in `list` (the page's <main>); `empty` is the hint shown while there are none.
export class MessageList {
  constructor(list, empty) {
    this.list = list;
    this.empty = empty;
  }

  add(article) {
    const stay = nearBottom();
    this.empty.hidden = true;
    this.list.append(article);
    keepBottom(stay);
    return article;
  }

  // Take every message away and show the hint again.
  clear() {
    for (const node of [...this.list.children]) if (node !== this.empty) node.remove();
    this.empty.hidden = false;
  }

  // The user's message: `images` are the data: URLs attached to it. Returns its <article>.
  user(text, images) {
    const article = element("article", "message user");
    article.append(element("div", "role", "You"));
    if (images.length) {
      const strip = element("div", "images");
      for (const url of images) strip.append(mediaElement(url, isVideo(url) ? "attached video" : "attached image"));
      article.append(strip);
    }
    if (text) article.append(element("div", "content", text));
    return this.add(article);
  }

  // The assistant's message as it streams, headed `role` (the model id): reasoning (collapsible) apart from
  // the answer. Returns the view the stream feeds (api.js's handleEvent), then end(outcome) once it is over.
  assistant(role) {
    const article = element("article", "message assistant");
    article.dataset.state = "streaming";
    const reasoning = element("details", "reasoning");
    reasoning.hidden = true;
    const summary = element("summary", "", "Reasoning");
    const reasoningText = element("div", "reasoning-text");
    const reasoningNode = document.createTextNode("");
    reasoningText.append(reasoningNode);
    reasoning.append(summary, reasoningText);
    const content = element("div", "content");
    const contentNode = document.createTextNode("");
    content.append(contentNode);
    const meta = element("div", "meta");
    article.append(element("div", "role", role), reasoning, content, meta);
    this.add(article);

    const started = performance.now();
    let firstToken = null;
    let usage = null;
    let finishReason = null;
    let failed = false;

    const grow = (node, text) => {
      const stay = nearBottom();
      if (firstToken === null) firstToken = performance.now();
      node.appendData(text);
      keepBottom(stay);
    };

    return {
      get text() { return contentNode.data; },
      get failed() { return failed; },
      reasoning(text) {
        if (reasoning.hidden) {
          reasoning.hidden = false;
          reasoning.open = true;
        }
        grow(reasoningNode, text);
      },
      content(text) {
        // The answer begins: fold the reasoning away (a click opens it again).
        if (!contentNode.data && reasoning.open) reasoning.open = false;
        grow(contentNode, text);
      },
      finish(reason) { finishReason = reason; },
      usage(value) { usage = value; },
      fail(message) {
        failed = true;
        article.append(element("div", "error", message));
      },
      // outcome: "done" or "stopped" (a failure shows as "error" either way).
      end(outcome) {
        article.dataset.state = failed ? "error" : outcome;
        const parts = [];
        if (usage) {
          article.dataset.promptTokens = usage.prompt_tokens;
          article.dataset.completionTokens = usage.completion_tokens;
          parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} generated tokens`);
          const seconds = (performance.now() - (firstToken ?? started)) / 1000;
          if (usage.completion_tokens > 1 && seconds > 0) {
            parts.push(`${(usage.completion_tokens / seconds).toFixed(1)} tokens/s`);
          }
        }
        if (outcome === "stopped") parts.push("stopped");
        else if (finishReason === "length") parts.push("cut at max tokens");
        meta.textContent = parts.join(" · ");
      },
    };
  }
}
