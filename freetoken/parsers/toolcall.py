"""Incremental scanners for one tool call in model output (JSON, XML and GLM forms).

Three call forms are accepted whatever the model (the form is detected from the first characters
after ``<tool_call>``: ``{`` is JSON, ``<function=`` is XML, a bare name is GLM):

* JSON (Qwen3 / Qwen3-Next, Hermes style)::

      <tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>

  The call ends at the first ``</tool_call>`` that is outside a JSON string, so string values may
  contain the closing tag. ``"arguments"`` may also be a JSON-object string or be named
  ``"parameters"``. Surplus closing braces before ``</tool_call>`` are ignored and one or two
  missing ones are supplied (:func:`parse_json_call`); a known tool's top-level argument values
  are typed by its schema (:func:`freetoken.parsers.schema.coerce_json_argument`: ``"5"`` for an
  integer becomes 5, a string field keeps ``"03106"``).
* XML (Qwen3.5 / Qwen3-Coder), wrapped in ``<tool_call>`` or bare::

      <tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

  A value ends only at a ``</parameter>`` that is followed (after whitespace) by another
  ``<parameter=`` or by ``</function>``; anything else, ``</function>`` and ``</tool_call>``
  included, is part of the value, so the only text a value cannot hold is ``</parameter>``
  followed by whitespace and ``<parameter=`` or ``</function>``. One newline after
  ``<parameter=ARG>`` and one before ``</parameter>`` are framing and removed (either may be
  missing); the rest of the value is byte-exact. Values are typed by
  :func:`freetoken.parsers.schema.coerce_parameter`. After ``</function>`` a wrapped call expects
  ``</tool_call>`` (a repeated ``</function>`` is skipped).
* GLM (GLM-4.5 / 4.6 / 4.7), always wrapped::

      <tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>

  NAME is letters, digits and ``_.:-`` (at most 256), ended by whitespace or ``<``; there may be
  any number of key/value pairs (none: ``<tool_call>NAME</tool_call>``), with any whitespace
  between the tags. As in the XML form a value ends only at an ``</arg_value>`` followed (after
  whitespace) by ``<arg_key>`` or ``</tool_call>``, so code values may hold the closing tags;
  values are byte-exact (no framing is removed) and typed by
  :func:`freetoken.parsers.schema.coerce_parameter`. A key without its value, or a name with
  other characters (``bash(x)``, ``just words``), makes the block malformed.

The scanners keep their position between calls, so feeding a long call token by token costs
linear time. A scanner never raises: it answers "need more text", a parsed call, or a malformed
block (which the caller returns as plain text).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from freetoken.parsers.schema import coerce_json_argument, coerce_parameter, finite_float

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
FUNC_OPEN = "<function="
FUNC_CLOSE = "</function>"
PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"
ARG_KEY_OPEN = "<arg_key>"
ARG_KEY_CLOSE = "</arg_key>"
ARG_VALUE_OPEN = "<arg_value>"
ARG_VALUE_CLOSE = "</arg_value>"
_NAME_LIMIT = 256
# GLM function names: OpenAI / Anthropic tool names plus the dots and colons MCP tools use;
# one character over the limit is matched so an overlong name is seen as such.
_GLM_NAME = re.compile(r"[\w.:-]{1,%d}" % (_NAME_LIMIT + 1))
_IN_STRING = re.compile(r'["\\]')
_OUT_STRING = re.compile(r'["<]')


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub_surrogates(value: object) -> object:
    """``value`` (decoded JSON) with every lone UTF-16 surrogate in its strings and keys replaced
    by U+FFFD.

    ``json.loads`` turns a ``\\ud83d`` escape without its pair into a lone surrogate, which no
    UTF-8 response can carry; a model that cut an emoji escape in half must not break the reply.
    """
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_surrogates(v) for v in value]
    return value


@dataclass(frozen=True)
class ParsedCall:
    """A complete tool call: function name and its arguments object."""

    name: str
    arguments: dict


@dataclass(frozen=True)
class Step:
    """Outcome of a scanner once the call's extent is known.

    Attributes:
        consumed: characters of the scanned buffer the call (or malformed block) spans.
        call: the parsed call, or None when the block is malformed and is to be shown as text.
    """

    consumed: int
    call: ParsedCall | None


def _skip_ws(buf: str, i: int) -> int:
    n = len(buf)
    while i < n and buf[i].isspace():
        i += 1
    return i


def _is_partial(buf: str, i: int, tags: tuple[str, ...]) -> bool:
    """True when ``buf[i:]`` is non-empty and a proper prefix of one of ``tags``."""
    tail = buf[i:]
    return bool(tail) and any(len(tail) < len(t) and t.startswith(tail) for t in tags)


def _valid_name(raw: str) -> bool:
    """A function/parameter name: one line, no angle brackets, not blank."""
    return bool(raw.strip(" \t")) and not any(c in raw for c in "<>\n\r")


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _load_call_object(text: str, closed: bool) -> object:
    """``json.loads`` of a call body, forgiving two slips models make at its end.

    * surplus closing braces (``{"name": "f", "arguments": {}}}``): the first JSON value is kept
      when nothing but ``}`` and whitespace follows it;
    * when ``closed`` (the model wrote ``</tool_call>`` itself), one or two missing closing
      braces (``{"name": "f", "arguments": {"a": 1}``). An output cut off before its closing tag
      gets no such repair: its arguments may be incomplete.

    Raises:
        ValueError: not valid JSON even after these repairs.
    """
    decoder = json.JSONDecoder(strict=False, parse_constant=_no_constants, parse_float=finite_float)
    try:
        value, end = decoder.raw_decode(text)
    except ValueError:
        if closed:
            for extra in ("}", "}}"):
                try:
                    return decoder.decode(text + extra)
                except ValueError:
                    continue
        raise
    if text[end:].replace("}", "").strip():
        raise ValueError("extra data after the call object")
    return value


def parse_json_call(
    body: str, schemas: dict[str, dict[str, dict]] | None = None, *, closed: bool = True
) -> ParsedCall | None:
    """Parse ``{"name": …, "arguments": {…}}``; None when it is not a valid call object.

    Raw control characters inside JSON strings are accepted (models write literal newlines in
    code); ``NaN``/``Infinity`` are not. Surplus closing braces at the end are ignored, and when
    ``closed`` (the body ended at ``</tool_call>``) one or two missing ones are supplied.

    Args:
        body: the text between ``<tool_call>`` and ``</tool_call>`` (or the end of output).
        schemas: tool name → JSON-schema ``properties``; a known tool's top-level argument
            values are typed by :func:`freetoken.parsers.schema.coerce_json_argument`.
        closed: the body was terminated by ``</tool_call>``.
    """
    try:
        obj = _load_call_object(body.strip(), closed)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args, strict=False, parse_constant=_no_constants,
                              parse_float=finite_float)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    props = (schemas or {}).get(obj["name"])
    if props:
        args = {key: coerce_json_argument(value, props.get(key)) for key, value in args.items()}
    return ParsedCall(obj["name"], args)


class _JsonScan:
    """Finds the ``</tool_call>`` that ends a JSON call body starting at ``start``."""

    def __init__(self, start: int, schemas: dict[str, dict[str, dict]]) -> None:
        self.start = start
        self.pos = start
        self.in_string = False
        self.schemas = schemas

    def advance(self, buf: str, final: bool) -> Step | None:
        n, p = len(buf), self.pos
        while p < n:
            if self.in_string:
                m = _IN_STRING.search(buf, p)
                if m is None:
                    p = n
                elif m.group() == "\\":
                    if m.end() >= n:  # the escaped character has not arrived yet
                        p = m.start()
                        break
                    p = m.end() + 1
                else:
                    self.in_string, p = False, m.end()
                continue
            m = _OUT_STRING.search(buf, p)
            if m is None:
                p = n
            elif m.group() == '"':
                self.in_string, p = True, m.end()
            elif buf.startswith(TOOL_CLOSE, m.start()):
                end = m.start()
                call = parse_json_call(buf[self.start : end], self.schemas)
                return Step(end + len(TOOL_CLOSE), call)
            elif _is_partial(buf, m.start(), (TOOL_CLOSE,)):
                p = m.start()
                break
            else:
                p = m.start() + 1
        self.pos = p
        if not final:
            return None
        if self.in_string:
            return Step(n, None)
        return Step(n, parse_json_call(buf[self.start : p], self.schemas, closed=False))


_MORE = object()  # a value step that advanced: keep scanning


class _ArgScan:
    """State the XML and GLM scanners share: the call's name, its typed arguments so far, the
    current argument (``key``) and where its value starts, and the search position of a closing
    tag whose follower is still unknown."""

    def __init__(self, start: int, schemas: dict[str, dict[str, dict]], state: str) -> None:
        self.pos = start
        self.schemas = schemas
        self.state = state
        self.name = ""
        self.args: dict = {}
        self.key = ""
        self.value_start = 0
        self.search = 0
        self.pending = -1  # a closing value tag whose follower is still unknown …
        self.after = 0  # … and how far the whitespace after it was skipped

    def _call(self) -> ParsedCall:
        return ParsedCall(self.name, dict(self.args))

    def _typed(self, raw: str) -> None:
        props = self.schemas.get(self.name)
        self.args[self.key] = coerce_parameter(raw, None if props is None else props.get(self.key))

    def _store(self, raw: str) -> None:
        self._typed(raw)

    def _value(self, buf: str, final: bool, close: str, followers: tuple[str, ...]) -> object:
        """One step inside a value that ends at a ``close`` tag followed (after whitespace) by
        one of ``followers``: :data:`_MORE` once the value is stored (state ``"between"``) or a
        ``close`` was found to belong to the value, else what ``advance`` returns."""
        n = len(buf)
        q = buf.find(close, self.search)
        if q < 0:
            if final:
                return n
            self.search = max(self.search, n - len(close) + 1)
            return None
        j = _skip_ws(buf, self.after if q == self.pending else q + len(close))
        if any(buf.startswith(tag, j) for tag in followers):
            self._store(buf[self.value_start : q])
            self.pos, self.state = q + len(close), "between"
        elif j == n or _is_partial(buf, j, followers):
            if not final:
                self.search, self.pending, self.after = q, q, j
                return None
            self._store(buf[self.value_start : q])
            return Step(n, self._call())
        else:
            self.search = q + 1  # that closing tag belongs to the value
        return _MORE


class _XmlScan(_ArgScan):
    """Parses ``<function=NAME>`` … ``</function>`` (then ``</tool_call>`` when wrapped)."""

    def __init__(self, start: int, schemas: dict[str, dict[str, dict]], wrapped: bool) -> None:
        super().__init__(start, schemas, "open")
        self.wrapped = wrapped

    def _store(self, raw: str) -> None:
        self._typed(raw[:-1] if raw.endswith("\n") else raw)

    def _tag_name(self, buf: str, name_start: int, final: bool) -> tuple[str, int] | None | int:
        """(name, index after '>'), None to wait, or an int: malformed at that index."""
        gt = buf.find(">", name_start, name_start + _NAME_LIMIT + 1)
        if gt < 0:
            tail = buf[name_start : name_start + _NAME_LIMIT + 1]
            if final or len(tail) > _NAME_LIMIT or any(c in tail for c in "<\n\r"):
                return name_start
            return None
        raw = buf[name_start:gt]
        return (raw.strip(" \t"), gt + 1) if _valid_name(raw) else name_start

    def advance(self, buf: str, final: bool) -> Step | None | int:
        """A Step when done, None to wait for more text, an int when malformed at that index."""
        n = len(buf)
        while True:
            if self.state == "open":
                got = self._tag_name(buf, self.pos + len(FUNC_OPEN), final)
                if not isinstance(got, tuple):
                    return got
                self.name, self.pos = got
                self.state = "between"
            elif self.state == "between":
                i = _skip_ws(buf, self.pos)
                if buf.startswith(PARAM_OPEN, i):
                    got = self._tag_name(buf, i + len(PARAM_OPEN), final)
                    if not isinstance(got, tuple):
                        return i if isinstance(got, int) else None
                    self.key, start = got
                    if start == n and not final:
                        return None  # cannot tell yet whether the framing newline follows
                    if start < n and buf[start] == "\n":
                        start += 1
                    self.value_start = self.search = start
                    self.state = "value"
                elif buf.startswith(FUNC_CLOSE, i):
                    self.pos = i + len(FUNC_CLOSE)
                    if not self.wrapped:
                        return Step(self.pos, self._call())
                    self.state = "close"
                elif i == n or _is_partial(buf, i, (PARAM_OPEN, FUNC_CLOSE)):
                    self.pos = i  # whitespace is not scanned again
                    return Step(n, self._call()) if final else None
                else:
                    return i
            elif self.state == "value":
                got = self._value(buf, final, PARAM_CLOSE, (PARAM_OPEN, FUNC_CLOSE))
                if got is not _MORE:
                    return got
            else:  # "close": after </function> of a wrapped call
                i = _skip_ws(buf, self.pos)
                if buf.startswith(TOOL_CLOSE, i):
                    return Step(i + len(TOOL_CLOSE), self._call())
                if buf.startswith(FUNC_CLOSE, i):  # a duplicated </function>
                    self.pos = i + len(FUNC_CLOSE)
                    continue
                if i == n or _is_partial(buf, i, (TOOL_CLOSE, FUNC_CLOSE)):
                    self.pos = i
                    return Step(n, self._call()) if final else None
                return i


class _GlmScan(_ArgScan):
    """Parses a GLM call ``NAME`` … ``</tool_call>`` (the buffer starts after ``<tool_call>``).

    States: "name" → "between" (expects ``<arg_key>`` or ``</tool_call>``) → "key" (after
    ``</arg_key>``, expects ``<arg_value>``) → "value" → "between"…
    """

    def __init__(self, start: int, schemas: dict[str, dict[str, dict]]) -> None:
        super().__init__(start, schemas, "name")

    def _key(self, buf: str, i: int, final: bool) -> int | None:
        """Reads ``<arg_key>K</arg_key>`` at ``i``: the index after it, None to wait, or -1 when
        malformed (no ``</arg_key>`` within the name limit, or not a valid name)."""
        start = i + len(ARG_KEY_OPEN)
        window = start + _NAME_LIMIT + len(ARG_KEY_CLOSE)
        close = buf.find(ARG_KEY_CLOSE, start, window)
        if close < 0:
            return -1 if final or len(buf) >= window else None
        raw = buf[start:close]
        if not _valid_name(raw):
            return -1
        self.key = raw.strip(" \t")
        return close + len(ARG_KEY_CLOSE)

    def advance(self, buf: str, final: bool) -> Step | None | int:
        """A Step when done, None to wait for more text, an int when malformed at that index."""
        n = len(buf)
        while True:
            if self.state == "name":
                end = _GLM_NAME.match(buf, self.pos).end()  # the scanner starts at a name char
                if end - self.pos > _NAME_LIMIT:
                    return self.pos
                if end == n:
                    return self.pos if final else None  # a name cut off by the end is no call
                if not (buf[end].isspace() or buf[end] == "<"):
                    return self.pos
                self.name, self.pos, self.state = buf[self.pos : end], end, "between"
            elif self.state == "between":
                i = _skip_ws(buf, self.pos)
                if buf.startswith(ARG_KEY_OPEN, i):
                    after = self._key(buf, i, final)
                    if after is None:
                        self.pos = i
                        return None
                    if after < 0:
                        return i
                    self.pos, self.state = after, "key"
                elif buf.startswith(TOOL_CLOSE, i):
                    return Step(i + len(TOOL_CLOSE), self._call())
                elif i == n or _is_partial(buf, i, (ARG_KEY_OPEN, TOOL_CLOSE)):
                    if final:  # complete except for its closing tag
                        return Step(n, self._call())
                    self.pos = i  # whitespace is not scanned again
                    return None
                else:
                    return i
            elif self.state == "key":
                i = _skip_ws(buf, self.pos)
                if buf.startswith(ARG_VALUE_OPEN, i):
                    self.value_start = self.search = i + len(ARG_VALUE_OPEN)
                    self.state = "value"
                elif not final and (i == n or _is_partial(buf, i, (ARG_VALUE_OPEN,))):
                    self.pos = i
                    return None
                else:
                    return i  # a key without its value
            else:  # "value"
                got = self._value(buf, final, ARG_VALUE_CLOSE, (ARG_KEY_OPEN, TOOL_CLOSE))
                if got is not _MORE:
                    return got


class CallScanner:
    """Scans one tool call from the text that follows its opening tag.

    For a wrapped call (any form) the buffer starts right after ``<tool_call>``; for a bare XML
    call it starts at ``<function=``. A malformed wrapped call spans up to and including the next
    ``</tool_call>`` (or the end of output); a malformed bare call spans up to the point where it
    stopped making sense, and the rest is scanned again as ordinary text.

    Args:
        schemas: tool name → JSON-schema properties (:func:`tool_parameter_schemas`).
        wrapped: the call was opened by ``<tool_call>``.
    """

    def __init__(self, schemas: dict[str, dict[str, dict]], wrapped: bool) -> None:
        self._schemas = schemas
        self._wrapped = wrapped
        self._inner: _JsonScan | _XmlScan | _GlmScan | None = (
            None if wrapped else _XmlScan(0, schemas, False)
        )
        self._bad_from: int | None = None

    def advance(self, buf: str, final: bool) -> Step | None:
        """The call's extent once known (always a Step when ``final``), else None."""
        if self._bad_from is None and self._inner is None:
            i = _skip_ws(buf, 0)
            if buf.startswith("{", i):
                self._inner = _JsonScan(i, self._schemas)
            elif buf.startswith(FUNC_OPEN, i):
                self._inner = _XmlScan(i, self._schemas, True)
            elif _GLM_NAME.match(buf, i):
                self._inner = _GlmScan(i, self._schemas)
            elif i == len(buf) or _is_partial(buf, i, (FUNC_OPEN,)):
                if not final:
                    return None
                self._bad_from = i
            else:
                self._bad_from = i
        if self._bad_from is None:
            got = self._inner.advance(buf, final)
            if got is None or isinstance(got, Step):
                return got
            if not self._wrapped:
                return Step(got, None)
            self._bad_from = got
        close = buf.find(TOOL_CLOSE, self._bad_from)
        if close >= 0:
            return Step(close + len(TOOL_CLOSE), None)
        if final:
            return Step(len(buf), None)
        self._bad_from = max(self._bad_from, len(buf) - len(TOOL_CLOSE) + 1)
        return None
