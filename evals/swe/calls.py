"""One model call as the recording relay saw it: timestamps, and what the answer says (id, usage,
finish reason, tool calls), parsed from a copy of the answer bytes.

* non-streaming answers (what mini-swe-agent sends): TTFT is the full response time (request
  received by the relay to the last response byte: the first token is only visible then) and
  decode tok/s is ``output_tokens / full response time``, i.e. a lower bound that includes the
  prefill;
* streamed answers (server-sent events, OpenAI Chat Completions or Anthropic Messages): TTFT is the
  time to the first event carrying generated text, reasoning or tool-call bytes, and decode tok/s
  is ``(output_tokens - 1) / (last byte - first token)``.

Usage fields: OpenAI ``prompt_tokens`` / ``completion_tokens`` / ``prompt_tokens_details.cached_tokens``;
Anthropic ``input_tokens`` (cache reads and writes excluded, so they are added back for the prompt),
``cache_read_input_tokens``, ``output_tokens`` (cumulative in ``message_delta``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

EVENT_END = re.compile(rb"\r?\n\r?\n")  # the blank line that ends a server-sent event
MODEL_PATHS = ("/chat/completions", "/completions", "/messages")
MAX_KEPT = 4 << 20  # bytes of a non-streamed answer kept for parsing its usage


@dataclass
class CallRecord:
    """One exchange through the relay.

    Times are seconds: ``started`` is ``time.monotonic()`` when the request body was fully
    received, ``head_s`` / ``first_token_s`` / ``total_s`` are offsets from it (None when never
    reached). Token counts come from the answer's ``usage`` (None when it had none):
    ``prompt_tokens`` is the whole prompt, ``cached_tokens`` the part served from the prefix cache.
    ``error`` is None, or a one-line description of a transport failure.
    """

    index: int
    method: str
    path: str
    stream: bool
    model: str | None
    started: float
    status: int | None = None
    head_s: float | None = None
    first_token_s: float | None = None
    total_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    response_id: str | None = None
    tool_calls: int = 0
    error: str | None = None
    _body: bytearray = field(default_factory=bytearray, repr=False)
    _sse: bytearray = field(default_factory=bytearray, repr=False)

    @property
    def is_model_call(self) -> bool:
        """A POST to a generation route (Chat Completions, Completions or Anthropic Messages)."""
        return self.method == "POST" and self.path.split("?", 1)[0].endswith(MODEL_PATHS)

    @property
    def ttft_s(self) -> float | None:
        """Seconds to the first token: streamed, the first generated-text event; else the full response."""
        return self.first_token_s if self.stream else self.total_s

    @property
    def decode_tps(self) -> float | None:
        """Output tokens per second (see the module docstring for the two definitions)."""
        if self.output_tokens is None or self.total_s is None:
            return None
        if not self.stream:
            return self.output_tokens / self.total_s if self.total_s > 0 else None
        if self.first_token_s is None or self.output_tokens < 2:
            return None
        span = self.total_s - self.first_token_s
        return (self.output_tokens - 1) / span if span > 0 else None

    def as_dict(self) -> dict:
        """The record for report.json (private buffers dropped, derived TTFT and tok/s added)."""
        data = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        data.pop("started")
        data.update(ttft_s=self.ttft_s, decode_tps=self.decode_tps, model_call=self.is_model_call)
        return data

    # -- answer parsing -------------------------------------------------------------------------

    def feed(self, chunk: bytes, now: float) -> None:
        """Account one piece of the answer body received ``now`` (monotonic seconds)."""
        if self.stream:
            self._sse += chunk
            while (end := EVENT_END.search(self._sse)) is not None:
                event = bytes(self._sse[:end.start()]).decode("utf-8", "replace")
                del self._sse[:end.end()]
                self._event(event, now)
        elif len(self._body) < MAX_KEPT:
            self._body += chunk

    def finish(self) -> None:
        """Parse a non-streamed answer once it is complete (a non-JSON body is left unparsed)."""
        if self.stream or not self._body:
            return
        try:
            body = json.loads(bytes(self._body))
        except ValueError:
            return
        if isinstance(body, dict):
            self._absorb(body, None)
        self._body = bytearray()

    def _event(self, event: str, now: float) -> None:
        lines = event.replace("\r\n", "\n").split("\n")
        data = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
        if not data or data == "[DONE]":
            return
        try:
            body = json.loads(data)
        except ValueError:
            return
        if isinstance(body, dict):
            self._absorb(body, now)

    def _absorb(self, body: dict, now: float | None) -> None:
        """Take ids, usage, finish reasons and (streamed: ``now`` set) the first-token time."""
        if body.get("type") == "message_start" and isinstance(body.get("message"), dict):
            self._absorb(body["message"], None)
            return
        if isinstance(body.get("id"), str) and self.response_id is None:
            self.response_id = body["id"]
        self._usage(body.get("usage"))
        generated = False
        for choice in body.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            part = choice.get("delta") if now is not None else choice.get("message")
            part = part if isinstance(part, dict) else {}
            if choice.get("text") or part.get("content") or part.get("reasoning_content") or part.get("reasoning"):
                generated = True
            calls = part.get("tool_calls") or []
            if calls:
                generated = True
                new = [c for c in calls if isinstance(c, dict) and (now is None or c.get("id"))]
                self.tool_calls += len(new)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if body.get("type") == "content_block_start" and (body.get("content_block") or {}).get("type") == "tool_use":
            self.tool_calls += 1
        if body.get("type") == "content_block_delta":
            generated = True
        if body.get("type") == "message" or body.get("type") == "message_delta":  # Anthropic
            reason = body.get("stop_reason") or (body.get("delta") or {}).get("stop_reason")
            self.finish_reason = reason or self.finish_reason
            if body.get("type") == "message":
                self.tool_calls += sum(1 for b in body.get("content") or [] if b.get("type") == "tool_use")
        if generated and now is not None and self.first_token_s is None:
            self.first_token_s = now - self.started

    def _usage(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        if "completion_tokens" in usage:  # OpenAI
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.output_tokens = usage.get("completion_tokens", self.output_tokens)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and details.get("cached_tokens") is not None:
                self.cached_tokens = details["cached_tokens"]
            return
        if "input_tokens" in usage or "output_tokens" in usage:  # Anthropic: input excludes cache reads
            cached = usage.get("cache_read_input_tokens") or 0
            created = usage.get("cache_creation_input_tokens") or 0
            if usage.get("input_tokens") is not None:
                self.prompt_tokens = usage["input_tokens"] + cached + created
                self.cached_tokens = cached
            if usage.get("output_tokens") is not None:
                self.output_tokens = usage["output_tokens"]
