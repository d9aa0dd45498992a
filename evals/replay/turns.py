"""Turn construction: one recorded call -> the HTTP request the harness would send.

Steps for call k of a thread:

1. The recorded history of call k (every trace line holds the full history as sent, so the
   assistant turns in it are the *recorded* responses, never what an engine generated; every
   engine sees identical requests).
2. Canonical form (:mod:`evals.replay.convert`), then the harness's edits for its next request:
   ``harness_adapters.get_adapter(call.harness).simulate_edits(messages, **EDIT_OPTIONS)``
   (SWE-agent: ``last_n_observations`` n=5, the benchmark configurations' window; the others
   their defaults: Claude Code, OpenCode and mini-swe-agent append-only, OpenClaw E10/E1).
3. The target protocol's body. When the recording is already in that protocol and the edits
   changed nothing, the recorded messages are sent verbatim (Anthropic ``cache_control`` and
   block layout kept); otherwise the edited canonical messages are converted.
4. ``max_tokens`` = the recorded response's output tokens: its ``usage`` (Anthropic
   ``output_tokens``, OpenAI ``completion_tokens``, OpenCode ``tokens.output +
   tokens.reasoning``), else :func:`estimate_tokens` of its text, tool names and arguments;
   calls without a recorded response (W1) use ``--w1-max-tokens``. ``stream: true``, and
   ``ignore_eos: true`` unless disabled (a vLLM/FreeToken extension that makes the engine
   decode exactly max_tokens tokens).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from evals.replay.convert import (
    anthropic_assistant_to_canonical, anthropic_to_canonical, block_text, canonical_to_anthropic,
    openai_assistant_to_canonical, openai_to_canonical, tools_to_anthropic, tools_to_openai,
)
from evals.replay.traces import Call
from harness_adapters import get_adapter

PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
EDIT_OPTIONS: dict[str, dict[str, Any]] = {"swe_agent": {"n": 5}}
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class RequestOptions:
    """Per-run request settings.

    Attributes:
        protocol: ``"openai"`` or ``"anthropic"``.
        model: the ``model`` field.
        ignore_eos: send ``ignore_eos: true``.
        edits: apply the harness edit simulators (False: the recorded history as is).
        default_max_tokens: max_tokens of calls without a recorded response (W1).
        temperature: sampling temperature sent. 1.0 (both APIs' default, what the harnesses
            send unless configured otherwise): with ignore_eos, greedy decoding of a small or
            random-weight model tends to repeat the end-of-turn token, whose text no server
            streams, so TTFT could not be seen.
    """

    protocol: str
    model: str
    ignore_eos: bool = True
    edits: bool = True
    default_max_tokens: int = 512
    temperature: float = 1.0


@dataclass(frozen=True)
class TurnRequest:
    """A ready request.

    Attributes:
        call: the call it replays.
        path: endpoint path (``/v1/chat/completions`` or ``/v1/messages``).
        body: the JSON body.
        max_tokens: output tokens asked for.
        max_tokens_source: ``"usage"`` | ``"estimate"`` | ``"default"``.
        edited: the harness edits changed the history.
        verbatim: the body's messages are the recorded ones, unchanged.
    """

    call: Call
    path: str
    body: dict
    max_tokens: int
    max_tokens_source: str
    edited: bool
    verbatim: bool


def estimate_tokens(text: str) -> int:
    """Token estimate of ``text``: ceil(characters / 4), at least 1 (the usual rule of thumb for
    English BPE vocabularies, also used by traces/README.md)."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def response_text(response: dict) -> str:
    """All generated text of a recorded response: content, reasoning, and each tool call's name
    and arguments (either wire format)."""
    content = response.get("content")
    if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") != "text"
                                         for b in content):
        msg = anthropic_assistant_to_canonical(content)
    else:
        msg = openai_assistant_to_canonical(response)
    parts = [block_text(msg.get("content")), str(msg.get("reasoning_content") or "")]
    for call in msg.get("tool_calls") or []:
        parts += [call["function"]["name"], call["function"]["arguments"]]
    return "".join(parts)


def recorded_output_tokens(response: dict | None) -> tuple[int, str] | None:
    """``(tokens, source)`` of a recorded response (``source``: ``"usage"`` or ``"estimate"``),
    or None when there is no response. Usage counts below 1 fall back to the estimate."""
    if not response:
        return None
    usage = response.get("usage") or {}
    count = None
    if isinstance(usage.get("output_tokens"), int):
        count = usage["output_tokens"]
    elif isinstance(usage.get("completion_tokens"), int):
        count = usage["completion_tokens"]
    elif isinstance(usage.get("tokens"), dict):
        tokens = usage["tokens"]
        count = int(tokens.get("output") or 0) + int(tokens.get("reasoning") or 0)
    if count is not None and count >= 1:
        return count, "usage"
    return estimate_tokens(response_text(response)), "estimate"


def canonical_history(call: Call) -> list[dict]:
    """The call's recorded history in canonical (OpenAI chat) form."""
    if call.protocol == "anthropic":
        return anthropic_to_canonical(call.messages)
    return openai_to_canonical(call.messages)


def edited_history(call: Call, edits: bool = True) -> tuple[list[dict], list[dict]]:
    """``(canonical, edited)`` histories of ``call`` (edited is canonical when ``edits`` is off).

    Raises:
        ValueError: unknown harness name or a malformed history.
    """
    canonical = canonical_history(call)
    if not edits:
        return canonical, canonical
    options = EDIT_OPTIONS.get(call.harness, {})
    return canonical, get_adapter(call.harness).simulate_edits(canonical, **options)


def build_request(call: Call, opts: RequestOptions) -> TurnRequest:
    """The streamed request replaying ``call`` (module docstring).

    Raises:
        ValueError: an unknown protocol or a history neither API can carry.
    """
    if opts.protocol not in PATHS:
        raise ValueError(f"protocol must be openai or anthropic, got {opts.protocol!r}")
    canonical, edited = edited_history(call, opts.edits)
    changed = edited != canonical
    verbatim = not changed and call.protocol == opts.protocol
    recorded = recorded_output_tokens(call.response)
    max_tokens, source = recorded if recorded else (opts.default_max_tokens, "default")
    body: dict[str, Any] = {"model": opts.model, "max_tokens": max_tokens, "stream": True,
                            "temperature": opts.temperature}
    if opts.protocol == "anthropic":
        if verbatim:
            msgs = list(call.messages)
            system = msgs.pop(0)["content"] if msgs and msgs[0].get("role") == "system" else None
        else:
            system, msgs = canonical_to_anthropic(edited)
        if system:
            body["system"] = system
        body["messages"] = msgs
        tools = tools_to_anthropic(call.tools)
    else:
        body["messages"] = edited
        verbatim = verbatim and edited == call.messages
        body["stream_options"] = {"include_usage": True}
        tools = tools_to_openai(call.tools)
    if tools:
        body["tools"] = tools
    if opts.ignore_eos:
        body["ignore_eos"] = True
    return TurnRequest(call, PATHS[opts.protocol], body, max_tokens, source, changed, verbatim)


def body_json(req: TurnRequest) -> bytes:
    """The request body as UTF-8 JSON bytes."""
    return json.dumps(req.body, ensure_ascii=False).encode("utf-8")
