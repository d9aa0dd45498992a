"""Token ids of real agent conversations from ../shared/traces, rendered with a model's chat template.

Trace format: ../shared/traces/README.md (one model call per line, ``messages`` in the OpenAI
chat or Anthropic block wire format). Both are mapped onto the message form
:class:`freetoken.chat.template.ChatTemplate` renders: Anthropic ``text`` blocks join into the
content, ``thinking`` becomes ``reasoning_content``, ``tool_use`` becomes ``tool_calls`` and each
``tool_result`` a ``tool`` message; OpenAI ``developer`` becomes ``system``. Traces are read at
run time, never copied into the repository.
"""

from __future__ import annotations

import json
from pathlib import Path

from freetoken.chat.template import ChatTemplate, TemplateError
from freetoken.paths import shared_dir
from freetoken.tokenizer.tokenizer import Tokenizer

DEFAULT_TRACES = shared_dir() / "traces"


def _text(content: object) -> str:
    """Plain text of a string or a list of text-bearing blocks (other blocks are skipped)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [_text(b.get("text", b.get("content"))) for b in content if isinstance(b, dict)]
        return "\n".join(p for p in parts if p)
    return ""


def _anthropic(role: str, blocks: list) -> list[dict]:
    if role != "assistant":
        out, texts = [], []
        for b in blocks:
            if b.get("type") == "tool_result":
                out.append({"role": "tool", "content": _text(b.get("content")),
                            "tool_call_id": str(b.get("tool_use_id", ""))})
            elif b.get("type") == "text":
                texts.append(b.get("text", ""))
        return ([{"role": role, "content": "\n".join(texts)}] if texts or not out else []) + out
    msg: dict = {"role": "assistant",
                 "content": "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")}
    thoughts = [b.get("thinking", "") for b in blocks if b.get("type") == "thinking"]
    if thoughts:
        msg["reasoning_content"] = "\n".join(thoughts)
    calls = [{"id": str(b.get("id", "")), "type": "function",
              "function": {"name": str(b.get("name", "tool")), "arguments": b.get("input", {})}}
             for b in blocks if b.get("type") == "tool_use"]
    if calls:
        msg["tool_calls"] = calls
    return [msg]


def template_messages(messages: list[dict]) -> list[dict]:
    """Trace ``messages`` (OpenAI or Anthropic blocks) -> ChatTemplate message dicts."""
    out: list[dict] = []
    for m in messages:
        role = {"developer": "system"}.get(m.get("role"), m.get("role"))
        content = m.get("content")
        if isinstance(content, list) and role in ("user", "assistant") and any(
            isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result", "thinking")
            for b in content
        ):
            out.extend(_anthropic(role, content))
            continue
        msg = {"role": role, "content": _text(content)}
        if role == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id", ""))
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = m["tool_calls"]
        out.append(msg)
    return out


def _render(template: ChatTemplate, messages: list[dict], tools: list | None) -> str:
    """The prompt text; a plain ``role: text`` transcript when the template rejects the turn."""
    converted = template_messages(messages)
    try:
        return template.render(converted, tools=tools or None)
    except TemplateError:
        return "\n\n".join(f"{m['role']}: {m.get('content', '')}" for m in converted)


def conversation_prompt(path: Path, tokenizer: Tokenizer, template: ChatTemplate,
                        max_tokens: int) -> list[int]:
    """Prompt ids of the latest model call of ``path`` whose rendered prompt fits ``max_tokens``,
    else the first ``max_tokens`` ids of its first call.

    Raises:
        FileNotFoundError: no such file. ValueError: an empty file.
    """
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    if not lines:
        raise ValueError(f"{path}: no model calls")
    ids: list[int] = []
    for call in reversed(lines):
        ids = tokenizer.encode(_render(template, call["messages"], call.get("tools")))
        if len(ids) <= max_tokens:
            return ids
    return ids[:max_tokens]
