"""Test doubles for the HTTP layer: a scripted engine and stand-ins for the chat template and the
output parser (the real ones live in freetoken/chat and freetoken/parsers and have their own tests).

FakeEngine implements EngineClient: each request pops a :class:`Script` whose text is turned into
token ids with the real committed tokenizer (freetoken/assets/tokenizer) and streamed token by
token, honouring ``max_tokens`` and stop strings like the real engine (no part of a matched stop
string is ever emitted).
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from jinja2 import TemplateError

from freetoken.core import EngineInfo, GenerationOutput, GenerationRequest, TokenLogprob
from freetoken.engine.client import EngineClient, EngineDeadError
from freetoken.engine.counters import EngineCounters
from freetoken.parsers.events import ReasoningDelta, TextDelta, ToolCallEvent
from freetoken.paths import ASSETS_DIR
from freetoken.tokenizer.tokenizer import Tokenizer

IM_END = "<|im_end|>"


@dataclass
class Script:
    """What the fake model "generates" for one request.

    Attributes:
        text: the output text (tokenized with the real tokenizer).
        token_delay_s: sleep between tokens.
        endless: repeat ``text`` until ``max_tokens`` (for disconnect tests).
        fail_after: after this many tokens, finish with ``error``.
        cached_tokens: reported prompt tokens served from cache.
        start_delay_s: sleep before the first token (a long prefill / queue wait).
        queued_s: sleep before the admission chunk (``report_admission``): a queue wait.
    """

    text: str
    token_delay_s: float = 0.0
    endless: bool = False
    fail_after: int | None = None
    cached_tokens: int = 0
    start_delay_s: float = 0.0
    queued_s: float = 0.0


@dataclass
class RequestLog:
    """What the server asked of the engine for one request, and how the stream ended."""

    request: GenerationRequest
    ended: threading.Event = field(default_factory=threading.Event)
    outcome: str = "running"  # "finished" | "closed" (the server closed the iterator early)
    tokens_sent: int = 0


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                best = max(best, k)
                break
    return best


class FakeEngine(EngineClient):
    """A scripted engine (see module docstring). ``push()`` queues scripts; ``logs`` records
    every request in arrival order.

    Operator surface: ``moe`` (a fake offload runtime or None), ``fake_counters`` (returned by
    ``counters()``), ``between_steps_calls`` (how often ``run_between_steps`` ran a function) and
    ``loop_dead`` (``run_between_steps`` raises EngineDeadError, as when the loop dies between
    the health check and the call).
    """

    DEFAULT_TEXT = "Hello from FreeToken."

    def __init__(self, max_model_len: int = 4096, model_type: str = "fake",
                 tokenizer: Tokenizer | None = None) -> None:
        """``tokenizer``: another model's tokenizer (its EOS ids are the engine's, the first one
        ends every script); default the committed one, ending on ``<|im_end|>``."""
        if tokenizer is None:
            self.tokenizer = Tokenizer.from_pretrained(ASSETS_DIR / "tokenizer")
            eos = (self.tokenizer.token_to_id(IM_END),)
        else:
            self.tokenizer, eos = tokenizer, tokenizer.eos_token_ids
        self.eos_id = eos[0]
        self.info = EngineInfo(
            model_path="fake",
            model_type=model_type,
            max_model_len=max_model_len,
            vocab_size=self.tokenizer.vocab_size,
            eos_token_ids=eos,
        )
        self.healthy = True
        self.scripts: deque[Script] = deque()
        self.logs: list[RequestLog] = []
        self._reset_operator_surface()

    def _reset_operator_surface(self) -> None:
        self.moe = None
        self.fake_counters = EngineCounters()
        self.between_steps_calls = 0
        self.loop_dead = False

    async def run_between_steps(self, fn):
        if self.loop_dead:
            raise EngineDeadError("engine loop died: RuntimeError: fake")
        self.between_steps_calls += 1
        return fn()

    def counters(self) -> EngineCounters:
        return self.fake_counters

    def push(self, text: str, **kwargs) -> None:
        """Queue the output of the next request."""
        self.scripts.append(Script(text, **kwargs))

    def reset(self) -> None:
        self.scripts.clear()
        self.logs.clear()
        self.healthy = True
        self._reset_operator_surface()

    def is_healthy(self) -> bool:
        return self.healthy

    @property
    def last(self) -> RequestLog:
        return self.logs[-1]

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        if not request.prompt_ids or len(request.prompt_ids) > self.info.max_model_len:
            raise ValueError("bad prompt")
        log = RequestLog(request)
        self.logs.append(log)
        script = self.scripts.popleft() if self.scripts else Script(self.DEFAULT_TEXT)
        return self._stream(request, script, log)

    def _logprobs(self, tok: int, n: int | None) -> tuple[TokenLogprob, ...] | None:
        if n is None:
            return None
        top = tuple((tok + k, self.tokenizer.decode([tok + k]), -0.5 - k) for k in range(n))
        return (TokenLogprob(tok, self.tokenizer.decode([tok]), -0.5, top),)

    async def _stream(
        self, request: GenerationRequest, script: Script, log: RequestLog
    ) -> AsyncIterator[GenerationOutput]:
        sp = request.sampling
        ids = self.tokenizer.encode(script.text)
        emitted: list[int] = []
        sent = ""

        def out(text: str, toks: tuple = (), reason=None, stop=None, **kw) -> GenerationOutput:
            return GenerationOutput(
                request.request_id,
                toks,
                text,
                reason,
                stop,
                prompt_tokens=len(request.prompt_ids),
                completion_tokens=len(emitted),
                cached_tokens=script.cached_tokens,
                **kw,
            )

        try:
            if script.queued_s:
                await asyncio.sleep(script.queued_s)
            if request.report_admission:  # admitted at once, as an idle engine would
                yield out("")
            if script.start_delay_s:
                await asyncio.sleep(script.start_delay_s)
            while script.endless or len(emitted) < len(ids):
                if len(emitted) >= sp.max_tokens:
                    log.outcome = "finished"
                    yield out(self.tokenizer.decode(emitted)[len(sent) :], reason="length")
                    return
                if script.fail_after is not None and len(emitted) >= script.fail_after:
                    log.outcome = "finished"
                    yield out("", reason="error", error="fake engine failure")
                    return
                tok = ids[len(emitted) % len(ids)]
                emitted.append(tok)
                log.tokens_sent = len(emitted)
                full = self.tokenizer.decode(emitted)
                found = [(full.find(s), s) for s in sp.stop if s in full]
                if found:
                    pos, stop = min(found)
                    log.outcome = "finished"
                    yield out(full[:pos][len(sent) :], (tok,), "stop", stop)
                    return
                delta = ""
                if not full.endswith("\ufffd"):
                    visible = full[: len(full) - _held_back(full, sp.stop)]
                    delta, sent = visible[len(sent) :], visible
                yield out(delta, (tok,), logprobs=self._logprobs(tok, sp.logprobs))
                if script.token_delay_s:
                    await asyncio.sleep(script.token_delay_s)
            log.outcome = "finished"
            yield out(self.tokenizer.decode(emitted)[len(sent) :], (), "stop", self.eos_id)
        finally:
            if log.outcome == "running":
                log.outcome = "closed"
            log.ended.set()


class ChatMLStandIn:
    """Stand-in for ChatTemplate: a minimal ChatML renderer that records every call.

    ``enable_thinking=True`` opens ``<think>\\n`` in the generation prompt, ``False`` writes an
    empty think block, None writes neither. A message whose content is ``__template_error__``
    makes it raise ``jinja2.TemplateError`` (as a template's ``raise_exception`` would). Other
    template variables (``reasoning_effort``) are recorded, not rendered.
    """

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def render(self, messages, tools=None, add_generation_prompt=True, enable_thinking=None,
               **template_kwargs) -> str:
        self.calls.append(
            {
                "messages": copy.deepcopy(messages),
                "tools": copy.deepcopy(tools),
                "enable_thinking": enable_thinking,
                "kwargs": dict(template_kwargs),
            }
        )
        out = []
        if tools:
            out.append("<|im_start|>system\n# Tools\n" + json.dumps(tools) + "<|im_end|>\n")
        for m in messages:
            if m["content"] == "__template_error__":
                raise TemplateError("stand-in template refused the conversation")
            body = m["content"]
            if m.get("reasoning_content"):
                body = f"<think>\n{m['reasoning_content']}\n</think>\n\n{body}"
            for call in m.get("tool_calls", []):
                fn = call["function"]
                args = (
                    fn["arguments"]
                    if isinstance(fn["arguments"], str)
                    else json.dumps(fn["arguments"])
                )
                body += (
                    f'\n<tool_call>\n{{"name": "{fn["name"]}", "arguments": {args}}}\n</tool_call>'
                )
            if m["role"] == "tool":
                out.append(
                    f"<|im_start|>user\n<tool_response>\n{body}\n</tool_response><|im_end|>\n"
                )
            else:
                out.append(f"<|im_start|>{m['role']}\n{body}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
            if enable_thinking is True:
                out.append("<think>\n")
            elif enable_thinking is False:
                out.append("<think>\n\n</think>\n\n")
        return "".join(out)


class TagParserStandIn:
    """Stand-in for OutputParser: ``<think>…</think>`` reasoning and Qwen-style
    ``<tool_call>{"name", "arguments"}</tool_call>`` calls, streaming-safe (a partial tag at the
    end of the buffer is held back)."""

    _NEXT = {"<think>": "reasoning", "</think>": "text", "<tool_call>": "tool"}

    def __init__(self, tools, *, in_reasoning: bool = False, parse_tools: bool = True) -> None:
        self.tools = tools
        self.mode = "reasoning" if in_reasoning else "text"
        self.parse_tools = parse_tools
        self.buf = ""
        self.calls = 0

    def feed(self, text: str) -> list:
        self.buf += text
        return self._drain(final=False)

    def finish(self, truncated: bool = False) -> list:
        return self._drain(final=True)

    def _emit(self, text: str, out: list) -> None:
        if text:
            out.append(ReasoningDelta(text) if self.mode == "reasoning" else TextDelta(text))

    def _drain(self, final: bool) -> list:
        out: list = []
        while True:
            if self.mode == "tool":
                end = self.buf.find("</tool_call>")
                if end < 0:
                    if final:
                        self.mode = "text"
                        self._emit("<tool_call>" + self.buf, out)
                        self.buf = ""
                    return out
                call = json.loads(self.buf[:end])
                self.buf = self.buf[end + len("</tool_call>") :]
                out.append(
                    ToolCallEvent(self.calls, call["name"], json.dumps(call.get("arguments", {})))
                )
                self.calls += 1
                self.mode = "text"
                continue
            tags = (
                ["</think>"]
                if self.mode == "reasoning"
                else ["<think>"] + (["<tool_call>"] if self.parse_tools else [])
            )
            hits = [(self.buf.find(t), t) for t in tags if t in self.buf]
            if hits:
                pos, tag = min(hits)
                self._emit(self.buf[:pos], out)
                self.buf = self.buf[pos + len(tag) :]
                self.mode = self._NEXT[tag]
                continue
            keep = (
                0
                if final
                else max(
                    (k for t in tags for k in range(1, len(t)) if self.buf.endswith(t[:k])),
                    default=0,
                )
            )
            self._emit(self.buf[: len(self.buf) - keep], out)
            self.buf = self.buf[len(self.buf) - keep :]
            return out
