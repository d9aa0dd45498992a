"""Streaming HTTP client for one replayed turn: sends the request, reads the SSE stream of either
protocol and measures TTFT and decode speed.

Definitions (wall clock, ``time.perf_counter``, seconds):

* **TTFT**: request sent -> first event that carries generated output: an OpenAI chunk whose
  ``delta`` has non-empty ``content``, ``reasoning_content``/``reasoning`` or ``tool_calls``; an
  Anthropic ``content_block_delta`` with non-empty ``text``/``thinking``/``partial_json``, or a
  ``content_block_start`` of a ``tool_use`` block (it carries the generated tool name).
* **decode tok/s**: (output tokens - 1) / (end of generation - first output event), the end
  being the event that reports the finish (OpenAI ``finish_reason``, Anthropic
  ``message_delta``), else the last output event. Not the last output event itself: an engine
  may hold back the text of its last tokens (a tool-call parser waiting for a closing tag, an
  incomplete UTF-8 sequence) and never stream it as such. None with fewer than 2 output tokens.
* **output tokens**: the response's usage (OpenAI ``completion_tokens`` with
  ``stream_options.include_usage``; Anthropic ``message_delta.usage.output_tokens``), else the
  number of output events (source ``"chunks"``).
* **prompt tokens / reused tokens**: OpenAI ``prompt_tokens`` /
  ``prompt_tokens_details.cached_tokens``; Anthropic ``input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens`` / ``cache_read_input_tokens`` (``message_delta`` values override
  those of ``message_start``). None when the endpoint does not report them.

Stream formats: OpenAI Chat Completions streaming (``data: {chunk}`` ... ``data: [DONE]``) and the
Anthropic Messages streaming events (shared/research/harnesses.md §6).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class StreamResult:
    """Measurements of one streamed request.

    Attributes:
        status: HTTP status (0 when the connection failed).
        error: error text (HTTP error body, an in-stream error event, a transport error) or None.
        ttft_s: time to first output event (s), or None when nothing was generated.
        decode_s: first output event -> end of generation (s), or None.
        total_s: request sent -> stream end (s).
        output_tokens: generated tokens (usage, else output events), None when unknown.
        output_tokens_source: ``"usage"`` or ``"chunks"``.
        prompt_tokens: prompt tokens reported by the endpoint, or None.
        reused_tokens: prompt tokens served from the endpoint's prefix cache, or None.
        finish_reason: OpenAI ``finish_reason`` / Anthropic ``stop_reason``.
        events: number of output events.
    """

    status: int
    error: str | None
    ttft_s: float | None
    decode_s: float | None
    total_s: float
    output_tokens: int | None
    output_tokens_source: str
    prompt_tokens: int | None
    reused_tokens: int | None
    finish_reason: str | None
    events: int

    @property
    def decode_tps(self) -> float | None:
        """Decode tokens per second after the first token (module docstring)."""
        if not self.output_tokens or self.output_tokens < 2 or not self.decode_s:
            return None
        return (self.output_tokens - 1) / self.decode_s


@dataclass
class _State:
    """Mutable accumulation while a stream is read."""

    t0: float
    status: int = 0
    first: float | None = None
    last: float | None = None
    end: float | None = None
    events: int = 0
    usage: dict = field(default_factory=dict)
    finish: str | None = None
    error: str | None = None

    def output(self) -> None:
        now = time.perf_counter()
        self.first = now if self.first is None else self.first
        self.last = now
        self.events += 1

    def finished(self) -> None:
        self.end = time.perf_counter()


def headers(protocol: str, api_key: str | None, extra: dict[str, str] | None = None
            ) -> dict[str, str]:
    """Request headers: JSON, the API key as ``Authorization: Bearer`` and ``x-api-key``, and
    ``anthropic-version`` for the Anthropic protocol."""
    out = {"content-type": "application/json", "accept": "text/event-stream"}
    if api_key:
        out["authorization"] = f"Bearer {api_key}"
        out["x-api-key"] = api_key
    if protocol == "anthropic":
        out["anthropic-version"] = ANTHROPIC_VERSION
    out.update(extra or {})
    return out


def _openai_event(state: _State, obj: dict) -> None:
    if obj.get("error"):
        state.error = json.dumps(obj["error"])[:500]
        return
    if obj.get("usage"):
        state.usage.update(obj["usage"])
    for choice in obj.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") \
                or delta.get("tool_calls"):
            state.output()
        if choice.get("finish_reason"):
            state.finish = choice["finish_reason"]
            state.finished()


def _anthropic_event(state: _State, obj: dict) -> None:
    kind = obj.get("type")
    if kind == "message_start":
        state.usage.update((obj.get("message") or {}).get("usage") or {})
    elif kind == "content_block_start":
        block = obj.get("content_block") or {}
        if block.get("type") in ("tool_use", "server_tool_use") or block.get("text") \
                or block.get("thinking"):
            state.output()
    elif kind == "content_block_delta":
        delta = obj.get("delta") or {}
        if delta.get("text") or delta.get("thinking") or delta.get("partial_json"):
            state.output()
    elif kind == "message_delta":
        state.usage.update(obj.get("usage") or {})
        state.finish = (obj.get("delta") or {}).get("stop_reason") or state.finish
        state.finished()
    elif kind == "error":
        state.error = json.dumps(obj.get("error", obj))[:500]


def _usage(protocol: str, usage: dict) -> tuple[int | None, int | None, int | None]:
    """``(prompt, reused, output)`` tokens from a final usage object."""
    if protocol == "anthropic":
        if "input_tokens" not in usage:
            return None, None, usage.get("output_tokens")
        read = usage.get("cache_read_input_tokens")
        prompt = int(usage["input_tokens"]) + int(read or 0) \
            + int(usage.get("cache_creation_input_tokens") or 0)
        return prompt, read, usage.get("output_tokens")
    details = usage.get("prompt_tokens_details") or {}
    return usage.get("prompt_tokens"), details.get("cached_tokens"), \
        usage.get("completion_tokens")


async def _read_stream(client: httpx.AsyncClient, url: str, body: bytes, protocol: str,
                       hdrs: dict[str, str], state: _State) -> None:
    """Send the request and feed its SSE events into ``state`` (``state.status`` is set as
    soon as the response head arrives). Raises httpx errors."""
    handle = _anthropic_event if protocol == "anthropic" else _openai_event
    async with client.stream("POST", url, content=body, headers=hdrs) as resp:
        state.status = resp.status_code
        if resp.status_code != 200:
            text = (await resp.aread()).decode("utf-8", "replace")
            state.error = f"HTTP {resp.status_code}: {text[:500]}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                obj = json.loads(data)
            except ValueError:
                continue
            if isinstance(obj, dict):
                handle(state, obj)


async def stream_turn(client: httpx.AsyncClient, url: str, body: bytes, protocol: str,
                      hdrs: dict[str, str], timeout_s: float | None = None) -> StreamResult:
    """POST ``body`` to ``url`` with ``stream: true`` and measure it (module docstring).

    ``timeout_s`` bounds the whole request (sent -> stream end, wall clock, seconds; None: no
    bound); a request that runs longer is abandoned with the error ``timed out after N s (whole
    request)``, keeping what was measured until then (TTFT, output events).

    Never raises for HTTP or transport errors or the timeout: they come back in
    ``StreamResult.error``.
    """
    state = _State(time.perf_counter())
    try:
        async with asyncio.timeout(timeout_s):
            await _read_stream(client, url, body, protocol, hdrs, state)
    except TimeoutError:
        state.error = f"timed out after {timeout_s:g} s (whole request)"
    except httpx.HTTPError as exc:
        state.error = f"{type(exc).__name__}: {exc}"
    total = time.perf_counter() - state.t0
    status = state.status
    prompt, reused, output = _usage(protocol, state.usage)
    # A usage of 0 output tokens next to output events is message_start's placeholder.
    source = "usage" if isinstance(output, int) and (output > 0 or not state.events) \
        else "chunks"
    return StreamResult(
        status=status, error=state.error,
        ttft_s=None if state.first is None else state.first - state.t0,
        decode_s=None if state.first is None
        else max(state.end or 0.0, state.last) - state.first,
        total_s=total, output_tokens=output if source == "usage" else (state.events or None),
        output_tokens_source=source, prompt_tokens=prompt, reused_tokens=reused,
        finish_reason=state.finish, events=state.events)
