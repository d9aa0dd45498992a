"""Streaming parser of gpt-oss output in OpenAI's harmony format.

Format (openai/harmony ``docs/format.md``; model-architectures.md §4): the prompt ends with
``<|start|>assistant`` and the model writes one or more messages, each
``HEADER<|message|>CONTENT`` ended by ``<|end|>`` (another message follows, opened by
``<|start|>assistant``), ``<|call|>`` (a tool call) or ``<|return|>`` (the final answer); the
engine stops on the last two, so the output usually just ends. The header names the channel
(``<|channel|>analysis``, ``commentary`` or ``final``) and, for a tool call, the recipient
(``to=functions.NAME``, before or after the channel) and maybe a content type
(``<|constrain|>json`` or `` json``)::

    <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}

What each message becomes:

* recipient ``functions.NAME`` (any channel; a bare ``NAME`` of a declared tool too):
  :class:`ToolCallEvent`, arguments the JSON object of the content (empty content: ``{}``; a
  known tool's top-level values typed as in the JSON form,
  :func:`freetoken.parsers.schema.coerce_json_argument`), emitted when the message ends. Content
  that is not a JSON object, or an empty name, makes it :class:`TextDelta` of the content, as
  the other forms return a malformed call as text (a call cut off by the token limit,
  ``finish(truncated=True)``, is dropped);
* another recipient (a built-in tool such as ``python``), or any call when ``parse_tools`` is
  False: :class:`ReasoningDelta` of the content (never an answer, never a reported call);
* ``analysis``, or a channel the format does not define: :class:`ReasoningDelta`;
* ``final``, ``commentary`` without a recipient (a preamble), or a header without a channel:
  :class:`TextDelta`;
* a role other than ``assistant`` (``<|start|>functions.x to=assistant…``): dropped.

Robustness: text where a message should start that is not a header (no ``<|channel|>``,
``to=`` or ``<|start|>``) is answer text up to the next message end; a ``<|channel|>`` inside
content starts a new message (the model left out ``<|end|><|start|>assistant``); other stray
format tokens in content are dropped, and whitespace between messages too. A header cut off by
the end of output, or ended by a message end before ``<|message|>``, is dropped; one longer than
:data:`HEADER_LIMIT` characters is dropped with everything up to the next message boundary.
Nothing here raises on model output, and no format token reaches an event.

Streaming: text and reasoning are released as soon as they cannot be the start of a format
token (only a suffix such as ``"<|en"`` is held); a call is emitted when its message ends.
Coalesced events (:func:`freetoken.parsers.events.coalesce`) do not depend on the chunking.
"""

from __future__ import annotations

import json
import re

from freetoken.parsers.events import ParserEvent, ReasoningDelta, TextDelta, ToolCallEvent, coalesce
from freetoken.parsers.schema import coerce_json_argument, finite_float, tool_parameter_schemas
from freetoken.parsers.toolcall import scrub_surrogates
from freetoken.parsers.stream import StreamParser

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
_EOT, _SOT, _EOP = "<|endoftext|>", "<|startoftext|>", "<|endofprompt|>"
FORMAT_TOKENS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN, _EOT, _SOT, _EOP)
_ENDS = frozenset({END, CALL, RETURN, _EOT})  # end the current message
_BOUNDARIES = _ENDS | {START}
HEADER_LIMIT = 1024
"""Characters a header may take before ``<|message|>`` (a recipient name is at most a few hundred;
longer means the output is not harmony and would otherwise be held back to the end)."""

_TOKEN_RE = re.compile("|".join(re.escape(t) for t in FORMAT_TOKENS))
_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")
_WORD = re.compile(r"[^\s<]+")
_MAX_TOKEN = max(len(t) for t in FORMAT_TOKENS)
_TEXT, _REASONING, _CALL, _DROP = "text", "reasoning", "call", "drop"
_START, _HEADER, _CONTENT, _SKIP = "start", "header", "content", "skip"
_OPENERS = (START, CHANNEL, CONSTRAIN, "to=")


def _partial_len(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of one of ``tags``."""
    for k in range(min(len(buf), _MAX_TOKEN - 1), 0, -1):
        tail = buf[-k:]
        if any(len(t) > k and t.startswith(tail) for t in tags):
            return k
    return 0


def parse_header(header: str) -> tuple[str, str | None, str | None]:
    """``(role, channel, recipient)`` of a header's text (format tokens written as text).

    The role is the first word before ``<|channel|>`` (``""`` when the prompt already wrote
    ``assistant``); the channel the first word after it (None without ``<|channel|>``); the
    recipient the value of the first ``to=`` (None without one).
    """
    head, sep, tail = header.partition(CHANNEL)
    role = _WORD.match(head.strip())
    channel = _WORD.match(tail) if sep else None
    recipient = _RECIPIENT.search(header.replace(CHANNEL, " ").replace(CONSTRAIN, " "))
    return (
        role.group() if role and not role.group().startswith("to=") else "",
        channel.group() if channel else (None if not sep else ""),
        recipient.group(1) if recipient else None,
    )


def _decode_object(text: str) -> dict | None:
    """The JSON object ``text`` holds (surplus closing braces after it ignored; a JSON string
    holding an object accepted), else None."""
    decoder = json.JSONDecoder(strict=False, parse_float=finite_float,
                               parse_constant=_refuse_constant)
    try:
        value, end = decoder.raw_decode(text)
        if text[end:].replace("}", "").strip():
            return None
        if isinstance(value, str):
            value = decoder.decode(value.strip())
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


class HarmonyParser(StreamParser):
    """Incremental parser of one gpt-oss answer (rules in the module docstring).

    Same interface as :class:`freetoken.parsers.output.OutputParser`.

    Args:
        tools: the request's tool definitions (used to type argument values), or None.
        in_reasoning: ignored (the channel of each message says what it is); accepted so the
            server can build either parser the same way.
        parse_tools: report tool calls; False when the request has no tools or ``tool_choice``
            is ``"none"``.
    """

    def __init__(self, tools: list[dict] | None, *, in_reasoning: bool = False,
                 parse_tools: bool = True) -> None:
        del in_reasoning
        self._schemas = tool_parameter_schemas(tools)
        self._parse_tools = parse_tools
        super().__init__()
        self._state = _START
        self._kind = _TEXT
        self._name = ""
        self._scan = 0  # where the next search for a format token starts in _buf

    def _drain(self, final: bool) -> list[ParserEvent]:
        out: list[ParserEvent] = []
        step = {_START: self._start_step, _HEADER: self._header_step,
                _CONTENT: self._content_step, _SKIP: self._skip_step}
        while step[self._state](final, out):
            pass
        return out

    def _find(self) -> re.Match | None:
        """The first format token in ``_buf`` at or after the scan position."""
        return _TOKEN_RE.search(self._buf, max(0, self._scan))

    def _consume(self, end: int, state: str) -> bool:
        self._buf, self._scan, self._state = self._buf[end:], 0, state
        return True

    def _start_step(self, final: bool, out: list[ParserEvent]) -> bool:
        """Between messages: a header follows, or plain text (answer text)."""
        self._buf = self._buf.lstrip()
        buf = self._buf
        if not buf:
            return False
        for token in _OPENERS:
            if buf.startswith(token):
                if token == START:
                    return self._consume(len(START), _HEADER)
                self._state = _HEADER
                return True
        m = _TOKEN_RE.match(buf)
        if m is not None:  # <|message|> with an empty header, a message end, a stray token
            if m.group() == MESSAGE:
                self._open_message("", None, None)
                return self._consume(m.end(), _CONTENT)
            return self._consume(m.end(), _START)
        if any(len(t) > len(buf) and t.startswith(buf) for t in _OPENERS + FORMAT_TOKENS):
            if not final:
                return False
            if len(buf) >= 2 and buf.startswith("<|"):
                self._buf = ""  # a format token cut off by the end of output
                return False
        self._kind, self._state = _TEXT, _CONTENT
        return True

    def _header_step(self, final: bool, out: list[ParserEvent]) -> bool:
        m = self._find()
        while m is not None and m.group() not in _BOUNDARIES and m.group() != MESSAGE:
            m = _TOKEN_RE.search(self._buf, m.end())  # <|channel|> / <|constrain|> belong here
        # Too long: decided where <|message|> starts (or could still start), so the outcome
        # does not depend on how the text was chunked.
        if m is None:
            if len(self._buf) - _partial_len(self._buf, FORMAT_TOKENS) > HEADER_LIMIT:
                return self._consume(len(self._buf), _SKIP)
            if final:
                self._buf = ""
                return False
            self._scan = max(self._scan, len(self._buf) - _MAX_TOKEN + 1)
            return False
        if m.group() == MESSAGE and m.start() > HEADER_LIMIT:
            return self._consume(m.end(), _SKIP)
        if m.group() == MESSAGE:
            self._open_message(*parse_header(self._buf[: m.start()]))
            return self._consume(m.end(), _CONTENT)
        if m.group() == START:
            return self._consume(m.end(), _HEADER)
        return self._consume(m.end(), _START)  # a message end before <|message|>: dropped

    def _open_message(self, role: str, channel: str | None, recipient: str | None) -> None:
        self._name = ""
        if role and role != "assistant":
            self._kind = _DROP
        elif recipient is not None:
            name = recipient[len("functions."):] if recipient.startswith("functions.") else None
            if name is None and recipient in self._schemas:
                name = recipient
            if name is not None and self._parse_tools:
                self._kind, self._name = _CALL, name
            else:
                self._kind = _REASONING
        elif channel in (None, "final", "commentary"):
            self._kind = _TEXT
        else:
            self._kind = _REASONING

    def _content_step(self, final: bool, out: list[ParserEvent]) -> bool:
        m = self._find()
        if m is None:
            buf = self._buf
            if self._kind == _CALL:  # a call is emitted whole, when its message ends
                if final:
                    k = _partial_len(buf, FORMAT_TOKENS)
                    self._end_call(buf[:-k] if k >= 2 else buf, out, cut=self._truncated)
                    self._buf = ""
                else:
                    self._scan = max(self._scan, len(buf) - _MAX_TOKEN + 1)
                return False
            k = _partial_len(buf, FORMAT_TOKENS)
            if final:
                text, self._buf = (buf[:-k] if k >= 2 else buf), ""
            else:
                text, self._buf = buf[: len(buf) - k], buf[len(buf) - k:]
            self._emit(text, out)
            return False
        token, body = m.group(), self._buf[: m.start()]
        if self._kind == _CALL:
            if token not in _BOUNDARIES and token != CHANNEL:
                self._scan = m.end()  # a stray token inside the arguments: part of them
                return True
            self._end_call(body, out)
        else:
            self._emit(body, out)
        if token in _ENDS:
            return self._consume(m.end(), _START)
        if token == START:
            return self._consume(m.end(), _HEADER)
        if token == CHANNEL:  # a new message without <|end|><|start|>assistant
            return self._consume(m.start(), _HEADER)
        self._buf, self._scan = self._buf[m.end():], 0  # a stray token: dropped
        return True

    def _skip_step(self, final: bool, out: list[ParserEvent]) -> bool:
        m = self._find()
        while m is not None and m.group() not in _BOUNDARIES:
            m = _TOKEN_RE.search(self._buf, m.end())
        if m is None:
            keep = 0 if final else _partial_len(self._buf, FORMAT_TOKENS)
            self._buf, self._scan = self._buf[len(self._buf) - keep:], 0
            return False
        return self._consume(m.end(), _HEADER if m.group() == START else _START)

    def _emit(self, text: str, out: list[ParserEvent]) -> None:
        if not text or self._kind == _DROP:
            return
        out.append(TextDelta(text) if self._kind == _TEXT else ReasoningDelta(text))

    def _end_call(self, body: str, out: list[ParserEvent], cut: bool = False) -> None:
        """The call message ended: its event (or its body as text when malformed; nothing when
        ``cut`` by the token limit)."""
        while _TOKEN_RE.search(body):  # stray <|message|> / <|constrain|> inside it
            body = _TOKEN_RE.sub("", body)
        if cut and not body.strip():  # cut before its arguments began: nothing to report
            self._kind = _TEXT
            return
        args = {} if not body.strip() else _decode_object(body.strip())
        if args is None or not self._name:
            self._kind = _TEXT
            if not cut:
                self._emit(body, out)
            return
        props = self._schemas.get(self._name)
        if props:
            args = {key: coerce_json_argument(value, props.get(key)) for key, value in args.items()}
        arguments = json.dumps(scrub_surrogates(args), ensure_ascii=False)
        out.append(ToolCallEvent(self._calls, scrub_surrogates(self._name), arguments))
        self._calls += 1


def parse_harmony(text: str, tools: list[dict] | None, *, parse_tools: bool = True
                  ) -> list[ParserEvent]:
    """Parse a complete (non-streamed) harmony output; adjacent deltas are coalesced.

    Same rules as :class:`HarmonyParser`.
    """
    parser = HarmonyParser(tools, parse_tools=parse_tools)
    return coalesce(parser.feed(text) + parser.finish())


def opens_harmony_reply(prompt: str) -> bool:
    """True when ``prompt`` ends with the harmony generation prompt ``<|start|>assistant`` (the
    model writes a header next and may open an analysis message)."""
    return prompt.endswith(START + "assistant")
