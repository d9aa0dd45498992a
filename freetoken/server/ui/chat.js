// The chat view: one streamed POST /v1/chat/completions; the reply is shown as it arrives.
"use strict";

// Calls onDelta(delta) for every streamed choice delta; returns the final usage (or null).
async function streamChat(messages, maxTokens, onDelta) {
  const headers = Object.assign({ "Content-Type": "application/json" }, authHeaders());
  const body = { model: "ui", messages, max_tokens: maxTokens, stream: true,
                 stream_options: { include_usage: true } };
  const r = await fetch("/v1/chat/completions", { method: "POST", headers, body: JSON.stringify(body) });
  if (!r.ok) {
    const data = await r.json().catch(() => null);
    throw new Error(data && data.error ? data.error.message : "HTTP " + r.status);
  }
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "", usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 1);
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") return usage;
      const chunk = JSON.parse(data);
      // the server ends a stream it cannot finish (shutdown, engine error) with an error chunk
      if (chunk.error) throw new Error(chunk.error.message || "the stream ended with an error");
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) onDelta(choice.delta || {});
    }
  }
  return usage;
}

function setupChat() {
  const form = document.getElementById("chat-form");
  const out = document.getElementById("chat-output");
  const reasoning = document.getElementById("chat-reasoning");
  const meta = document.getElementById("chat-meta");
  const send = document.getElementById("chat-send");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = document.getElementById("chat-input").value;
    const maxTokens = parseInt(document.getElementById("chat-max").value, 10) || 32;
    out.textContent = "";
    reasoning.textContent = "";
    meta.textContent = "sending...";
    send.disabled = true;
    const started = performance.now();
    let first = null;
    try {
      const usage = await streamChat([{ role: "user", content: text }], maxTokens, (delta) => {
        if (first === null && (delta.content || delta.reasoning_content)) first = performance.now();
        if (delta.reasoning_content) reasoning.textContent += delta.reasoning_content;
        if (delta.content) out.textContent += delta.content;
      });
      const ttft = first === null ? "-" : ((first - started) / 1000).toFixed(3) + " s";
      meta.textContent = "done; first text after " + ttft +
        (usage ? ", " + usage.completion_tokens + " tokens generated" : "");
    } catch (err) {
      meta.textContent = "error: " + err.message;
    } finally {
      send.disabled = false;
    }
  });
}
