"""Launch llama.cpp's OpenAI-compatible server (llama-cpp-python) for the side-by-side runs.

Usage (peer venv)::

    python evals/peers/llamacpp_server.py --model X.gguf --port 8401 --n_ctx 65536 \
        --n_threads 2 --n_threads_batch 2 --logits_all false ...

Every flag of ``python -m llama_cpp.server`` is accepted unchanged (they are read with
llama-cpp-python's own ``add_args_from_model`` / ``parse_model_from_args``). Three benchmark
adaptations are added on top of the stock app, all in this file:

* ``ignore_eos``: the replay (``evals/run.py``) sends ``ignore_eos: true`` so every engine decodes
  exactly ``max_tokens`` tokens. llama-cpp-python's request model silently drops unknown fields,
  so a small ASGI middleware turns the flag into a ``logit_bias`` of -1e9 on every
  end-of-generation id of the vocabulary (``llama_vocab_is_eog``), which the server supports;
  greedy output then never ends early. (FreeToken emits the EOS token and continues; llama.cpp
  picks the next-best token instead: the same number of decode steps.)
* text-part content: llama-cpp-python's typed request model accepts a list of content parts
  only in user messages and answers 500 for an assistant/system/tool message whose ``content``
  is ``[{"type": "text", "text": ...}]`` (valid OpenAI, sent by OpenClaw in W4). Such a list of
  text parts is joined into one string, which the chat template renders identically (FreeToken's
  templates concatenate text parts).
* streamed ``usage``: llama-cpp-python's streams carry no token counts. ``Llama.generate`` is
  wrapped to record the prompt length, the prompt tokens it reuses from the previous request
  (the same longest-common-prefix rule as ``Llama.generate``: a fully cached prompt still
  re-evaluates its last token) and the number of generated tokens, and a final chunk with
  ``choices: []`` and ``usage`` (``prompt_tokens``, ``completion_tokens``,
  ``prompt_tokens_details.cached_tokens``) is appended to every chat stream, the format OpenAI
  uses for ``stream_options.include_usage``.

The server handles one request at a time (llama-cpp-python serialises requests on one context).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import uvicorn
from llama_cpp import Llama
import llama_cpp
import llama_cpp.server.app as server_app
from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings

BAN = -1e9
_COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")
_STATS: dict[str, int] = {}


def _patch_llama() -> None:
    """Wrap ``Llama.generate`` (token counts) and ``Llama.create_chat_completion`` (usage chunk)."""
    generate = Llama.generate
    create_chat = Llama.create_chat_completion

    def counted_generate(self: Llama, tokens, *args, **kwargs):
        tokens = list(tokens)
        reused = 0
        if self.n_tokens > 0:
            for a, b in zip(self._input_ids, tokens):
                if a != b:
                    break
                reused += 1
            if reused == len(tokens) and self.n_tokens != len(tokens):
                reused -= 1  # Llama.generate replays the last prompt token
        _STATS.update(prompt=len(tokens), reused=reused, generated=0)
        for token in generate(self, tokens, *args, **kwargs):
            _STATS["generated"] += 1
            yield token

    def chat_with_usage(self: Llama, *args, **kwargs):
        result = create_chat(self, *args, **kwargs)
        if not kwargs.get("stream"):
            return result
        return _append_usage(result)

    Llama.generate = counted_generate
    Llama.create_chat_completion = chat_with_usage


def _append_usage(chunks):
    last: dict[str, Any] = {}
    for chunk in chunks:
        last = chunk
        yield chunk
    # the sampled token that ends a stream is counted by generate but never returned when it
    # is an end-of-generation id; with ignore_eos it cannot be one.
    completion = _STATS.get("generated", 0)
    if last.get("choices") and last["choices"][0].get("finish_reason") == "stop":
        completion = max(0, completion - 1)
    prompt = _STATS.get("prompt", 0)
    yield {"id": last.get("id", "chatcmpl-usage"), "object": "chat.completion.chunk",
           "created": last.get("created", int(time.time())), "model": last.get("model", ""),
           "choices": [],
           "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion,
                     "prompt_tokens_details": {"cached_tokens": _STATS.get("reused", 0)}}}


def eog_ids(llm: Llama) -> list[int]:
    """Every end-of-generation token id of the loaded vocabulary (``llama_vocab_is_eog``)."""
    vocab = llm._model.vocab
    return [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i)]


def join_text_parts(messages) -> None:
    """In place: every message whose ``content`` is a non-empty list of only ``{"type": "text"}``
    parts gets the concatenated string instead (lists with other part types are left alone)."""
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and content and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content):
            message["content"] = "".join(p["text"] for p in content)


class IgnoreEosMiddleware:
    """ASGI middleware on completion bodies: ``ignore_eos: true`` -> ``logit_bias`` bans on the
    EOG ids (merged with any ``logit_bias`` already there), and text-part lists joined
    (:func:`join_text_parts`); other requests pass untouched.

    Args:
        app: the wrapped ASGI app.
        banned: the EOG token ids.
    """

    def __init__(self, app, banned: list[int]) -> None:
        self.app = app
        self.bias = {str(i): BAN for i in banned}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" \
                or scope.get("path") not in _COMPLETION_PATHS:
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict):
            if data.pop("ignore_eos", False):
                data["logit_bias"] = {**self.bias, **(data.get("logit_bias") or {})}
                data.pop("logit_bias_type", None)  # keys are token ids
            join_text_parts(data.get("messages"))
            body = json.dumps(data).encode("utf-8")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app({**scope, "headers": headers}, replay, send)


def main(argv: list[str] | None = None) -> int:
    """Parse llama-cpp-python's own server flags, load the model, serve until killed."""
    parser = argparse.ArgumentParser(description="llama-cpp-python server + benchmark adaptations")
    add_args_from_model(parser, Settings)
    args = parser.parse_args(argv)
    server_settings = parse_model_from_args(ServerSettings, args)
    model_settings = [parse_model_from_args(ModelSettings, args)]
    _patch_llama()
    app = server_app.create_app(server_settings=server_settings, model_settings=model_settings)
    llm = server_app._llama_proxy()  # the default model, loaded by create_app
    banned = eog_ids(llm)
    print(f"llamacpp_server: ignore_eos bans EOG ids {banned}", file=sys.stderr, flush=True)
    uvicorn.run(IgnoreEosMiddleware(app, banned),
                host=os.getenv("HOST", server_settings.host),
                port=int(os.getenv("PORT", server_settings.port)), log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
