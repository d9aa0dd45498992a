"""The prompt token ids the server renders for a recorded request, computed in the test process
through the server's own steps (request model → template messages → harness adapter
normalisation → chat template → tokenizer), to measure the unchanged prefix between two turns."""

from __future__ import annotations

from functools import lru_cache

from harness_adapters import RequestInfo, detect_adapter, get_adapter
from freetoken.chat.template import ChatTemplate
from freetoken.server.anthropic_chat import enable_thinking
from freetoken.server.anthropic_protocol import MessagesRequest
from freetoken.server.messages import from_anthropic, from_openai
from freetoken.server.openai_protocol import ChatCompletionRequest
from freetoken.server.prompt import render_prompt, thinking_from_kwargs
from freetoken.server.tools import anthropic_tools, openai_tools
from freetoken.tokenizer.tokenizer import Tokenizer

from .tap import Exchange


@lru_cache(maxsize=1)
def _served() -> tuple[Tokenizer, ChatTemplate]:
    from freetoken.models.tiny import default_model_path

    tokenizer = Tokenizer.from_pretrained(default_model_path())
    return tokenizer, ChatTemplate.for_model(tokenizer.chat_template, "qwen3_next")


def rendered_ids(ex: Exchange) -> list[int]:
    """Prompt token ids of a recorded ``/v1/chat/completions`` or ``/v1/messages`` request, as the
    live server (embedded tiny qwen3_next) renders it."""
    tokenizer, template = _served()
    body = ex.request_json()
    headers = {k.lower(): v for k, v in ex.request_headers.items()}
    if ex.path == "/v1/messages":
        api = "anthropic"
        req = MessagesRequest.model_validate(body)
        policy, messages, thinking = anthropic_tools(req), from_anthropic(req.system, req.messages), enable_thinking(req)
    else:
        api = "openai"
        req = ChatCompletionRequest.model_validate(body)
        policy, messages = openai_tools(req), from_openai(req.messages)
        thinking = thinking_from_kwargs(req.chat_template_kwargs, req.reasoning_effort)
    forced = headers.get("x-freetoken-harness")
    info = RequestInfo(api=api, path=ex.path, headers=headers, body=body)
    adapter = get_adapter(forced) if forced else detect_adapter(info)
    messages = adapter.normalize(messages)
    return list(render_prompt(template, tokenizer, messages, policy.tools, thinking).token_ids)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token id lists."""
    n = 0
    limit = min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n
