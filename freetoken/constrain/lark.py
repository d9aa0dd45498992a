"""The Lark grammar (llguidance dialect) of a :class:`ToolCallGrammar`.

llguidance's Lark syntax (guidance-ai/llguidance ``docs/syntax.md``) adds three things used here:
``%json {schema}`` as a rule body (a JSON-schema grammar inside the Lark one), ``<[ID]>`` for one
special token, and ``&`` / ``~`` on regex terminals with ``[lazy]`` rules (a lexeme that ends at
the first place its text matches). The grammar mirrors what the chat templates render and what
:mod:`freetoken.parsers.toolcall` (:mod:`freetoken.parsers.harmony`) reads back:

* json form: ``<tool_call>`` ``\\n{"name": "NAME", "arguments": `` ARGS ``}\\n`` ``</tool_call>``,
  ARGS the tool's schema written compactly with ``", "`` / ``": "`` separators (Jinja ``tojson``);
* xml form: ``<tool_call>`` ``\\n<function=NAME>\\n`` then for each declared parameter, in schema
  order (required ones always, optional ones maybe), ``<parameter=ARG>\\nVALUE\\n</parameter>\\n``,
  then ``</function>\\n`` ``</tool_call>``. A parameter whose schema accepts a string is written
  as raw text (enum/const choices, a pattern, min/maxLength honoured; it never contains
  ``</parameter>``), any other as JSON of its schema;
* glm form (GLM-4.5): ``<tool_call>`` ``NAME\n`` then for each declared parameter, in schema
  order, ``<arg_key>ARG</arg_key>\n<arg_value>VALUE</arg_value>\n`` (VALUE as in the xml form,
  ending at ``</arg_value>``), then ``</tool_call>``;
* harmony form (gpt-oss): ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>``
  then ARGS, the tool's schema written compactly (``,`` / ``:`` separators, as the model writes
  it and templates/gpt_oss.jinja renders it); with ``reasoning`` an analysis message
  ``<|channel|>analysis<|message|>TEXT<|end|><|start|>assistant`` may come first. One call; the
  model's ``<|call|>``, a stop token, is the EOS that ends it.

Schemas are made strict before compiling: an object schema that lists ``properties`` and does not
say ``additionalProperties`` gets ``additionalProperties: false`` (xgrammar / vLLM strict mode),
so a call only writes declared arguments; a top-level schema without ``type`` is an object.
Keywords the JSON compiler does not implement are ignored (llguidance ``lenient``).

Around the calls: with ``reasoning`` the grammar starts with free text (no special token) up to
``</think>`` and up to two newlines; calls are separated by up to two newlines; no other text is
allowed (an answer is not a call, so it cannot be the whole output of a forced choice).

Tags that are single added tokens of the tokenizer (``<tool_call>``, ``</tool_call>``,
``</think>`` in the Qwen vocabularies, GLM's ``<arg_key>`` / ``<arg_value>`` pairs, the harmony
tokens of gpt-oss) are written as token references: llguidance's Hugging Face loader marks every
added token special, so such a token never matches the same text written as a string literal.
Tags the tokenizer lacks are written as text. A ``$ref`` is resolved only to decide whether an
XML value is raw text (the parser does not resolve it: an enum value that reads as JSON, ``"1"``
or ``"true"``, would come back typed).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from freetoken.constrain.spec import GrammarError, ToolCallGrammar

TagRef = Callable[[str], "str | None"]
"""``tag text -> "<[ID]>"`` when the tokenizer has the tag as one special token, else None."""

JSON_OPTIONS = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,
}
"""llguidance ``x-guidance`` options of every embedded JSON schema: Jinja ``tojson`` spacing."""
COMPACT_JSON_OPTIONS = {**JSON_OPTIONS, "item_separator": ",", "key_separator": ":"}
"""The same for the harmony form: compact separators."""

TOOL_OPEN, TOOL_CLOSE, THINK_CLOSE = "<tool_call>", "</tool_call>", "</think>"
ARG_KEY_OPEN, ARG_KEY_CLOSE = "<arg_key>", "</arg_key>"
ARG_VALUE_OPEN, ARG_VALUE_CLOSE = "<arg_value>", "</arg_value>"
H_START, H_END, H_MESSAGE = "<|start|>", "<|end|>", "<|message|>"
H_CHANNEL, H_CONSTRAIN = "<|channel|>", "<|constrain|>"
_PARAM_CLOSE = "\n</parameter>\n"
_NOT_PARAM_CLOSE = r"~/(.|\n)*<\/parameter>(.|\n)*/"
_DEF_KEYS = ("$defs", "definitions")
_ARGS_CLOSE = json.dumps("}\n")


def _lit(text: str) -> str:
    """A Lark string literal of ``text`` (JSON escapes, which Lark shares)."""
    return json.dumps(text)


def no_tags(_text: str) -> str | None:
    """A :data:`TagRef` that writes every tag as text (validation without a tokenizer)."""
    return None


def tag_writer(tag_ref: TagRef) -> Callable[[str], str]:
    """``tag text -> Lark expression``: its special-token reference, else a string literal."""
    return lambda text: tag_ref(text) or _lit(text)


def close_objects(schema: object) -> object:
    """A copy of ``schema`` where every object schema with ``properties`` and no
    ``additionalProperties`` forbids undeclared properties (recursively)."""
    if isinstance(schema, list):
        return [close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", *_DEF_KEYS) and isinstance(value, dict):
            out[key] = {k: close_objects(v) for k, v in value.items()}
        elif key in ("items", "prefixItems", "additionalProperties", "anyOf", "oneOf",
                     "allOf", "not", "contains", "additionalItems"):
            out[key] = close_objects(value)
        else:
            out[key] = value
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_rule(schema: dict, options: dict = JSON_OPTIONS) -> str:
    body = dict(schema)
    body["x-guidance"] = options
    return "%json " + json.dumps(body)


def arguments_schema(name: str, parameters: str) -> dict:
    """The strict object schema of a tool's arguments.

    Raises:
        GrammarError: the schema's ``type`` is given and is not ``"object"``.
    """
    schema = json.loads(parameters)
    kind = schema.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise GrammarError(f"tool {name!r}: parameters must be an object schema, got type {kind!r}")
    schema = close_objects(schema)
    schema["type"] = "object"
    return schema


def _valid_xml_name(name: str, what: str) -> None:
    if not name.strip(" \t") or any(c in name for c in "<>\n\r"):
        raise GrammarError(f"{what} {name!r} cannot be written in the XML call form")


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        for key in _DEF_KEYS:
            prefix = f"#/{key}/"
            if ref.startswith(prefix) and isinstance(root.get(key), dict):
                target = root[key].get(ref[len(prefix):])
                if isinstance(target, dict):
                    return target
    return schema


def _string_schema(schema: dict, root: dict) -> dict | None:
    """The string schema an XML value follows as raw text, or None when it is written as JSON
    (same rule as ``freetoken.parsers.schema.coerce_parameter``: any schema accepting a string)."""
    schema = _resolve(schema, root)
    kind = schema.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return schema
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            if isinstance(sub, dict) and _string_schema(sub, root) is not None:
                return _string_schema(sub, root)
    if kind is None:
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            return schema
        if isinstance(schema.get("const"), str):
            return schema
    return None


def _text_terminal(schema: dict, excluded: str | None = _NOT_PARAM_CLOSE) -> str:
    """Regex terminal body of a raw string value (never containing ``</parameter>``, or what
    ``excluded`` refuses; None: no exclusion, the value ends at a special token)."""
    lo = schema.get("minLength", 0)
    hi = schema.get("maxLength")
    lo = lo if isinstance(lo, int) and lo >= 0 else 0
    upper = str(hi) if isinstance(hi, int) and hi >= lo else ""
    parts = [rf"/(.|\n){{{lo},{upper}}}/"]
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        import llguidance

        if pattern.startswith("^"):
            pattern = pattern[1:]
        if pattern.endswith("$") and not pattern.endswith("\\$"):
            pattern = pattern[:-1]
        parts.append("/" + llguidance.regex_to_lark(pattern, "dw") + "/")
    return " & ".join(parts + ([excluded] if excluded else []))


def _xml_value(rule: str, schema: dict, root: dict, out: list[str],
               close: str = _lit(_PARAM_CLOSE), excluded: str | None = _NOT_PARAM_CLOSE) -> None:
    """Rules of one argument value: raw text for a string schema, else JSON, then ``close``
    (a Lark expression). ``excluded``: what raw text may not contain (the closing tag written as
    text, the value then ends lazily at it), or None when the closing tag is a special token."""
    text = _string_schema(schema, root)
    if text is None:
        sub = close_objects(schema)
        defs = {k: root[k] for k in _DEF_KEYS if k in root and k not in sub}
        out.append(f"{rule}: {rule}_json {close}")
        out.append(f"{rule}_json: {json_rule({**sub, **defs})}")
        return
    choices = text.get("enum") if isinstance(text.get("enum"), list) else None
    if isinstance(text.get("const"), str):
        choices = [text["const"]]
    if choices is not None:
        literals = [_lit(v) for v in choices if isinstance(v, str)]
        if not literals:
            raise GrammarError(f"{rule}: a string enum without string values")
        out.append(f"{rule}: ({' | '.join(literals)}) {close}")
        return
    term = rule.upper() + "_TEXT"
    out.append(f"{rule}{'[lazy]' if excluded else ''}: {term} {close}")
    out.append(f"{term}: {_text_terminal(text, excluded)}")


def _xml_call(i: int, name: str, schema: dict, out: list[str]) -> str:
    _valid_xml_name(name, "tool name")
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or [])
    seq = []
    for j, (arg, sub) in enumerate(props.items()):
        _valid_xml_name(arg, f"tool {name!r} parameter")
        rule = f"param_{i}_{j}"
        opener = _lit(f"<parameter={arg}>\n")
        out.append(f"{rule}: {opener} {rule}_value")
        _xml_value(f"{rule}_value", sub if isinstance(sub, dict) else {}, schema, out)
        seq.append(rule if arg in required else f"{rule}?")
    return " ".join([_lit(f"\n<function={name}>\n"), *seq, _lit("</function>\n")])


def _glm_call(i: int, name: str, schema: dict, out: list[str], tag: Callable[[str], str],
              tag_ref: TagRef) -> str:
    """``NAME\n`` then per declared argument (schema order, optional ones maybe)
    ``<arg_key>ARG</arg_key>\n<arg_value>VALUE</arg_value>\n``, as the GLM template writes."""
    _valid_xml_name(name, "tool name")
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = set(schema.get("required") or [])
    close_ref = tag_ref(ARG_VALUE_CLOSE)
    excluded = None if close_ref else _not_containing(ARG_VALUE_CLOSE)
    close = f"{tag(ARG_VALUE_CLOSE)} {_lit(chr(10))}"
    seq = []
    for j, (arg, sub) in enumerate(props.items()):
        _valid_xml_name(arg, f"tool {name!r} parameter")
        rule = f"param_{i}_{j}"
        key = f"{tag(ARG_KEY_OPEN)} {_lit(arg)} {tag(ARG_KEY_CLOSE)} {_lit(chr(10))}"
        out.append(f"{rule}: {key} {tag(ARG_VALUE_OPEN)} {rule}_value")
        _xml_value(f"{rule}_value", sub if isinstance(sub, dict) else {}, schema, out, close,
                   excluded)
        seq.append(rule if arg in required else f"{rule}?")
    return " ".join([_lit(f"{name}\n"), *seq])


def _not_containing(text: str) -> str:
    """A Lark regex refusing any string that contains ``text``."""
    escaped = "".join("\\" + c if c in "\\.+*?()|[]{}^$/" else c for c in text)
    return rf"~/(.|\n)*{escaped}(.|\n)*/"


def harmony_analysis_rules(tag: Callable[[str], str], tag_ref: TagRef) -> list[str]:
    """Rules of ``analysis``: one harmony analysis message, then ``<|start|>assistant``."""
    head = f"{tag(H_CHANNEL)} {_lit('analysis')} {tag(H_MESSAGE)}"
    tail = f"{tag(H_START)} {_lit('assistant')}"
    if tag_ref(H_END) is None:  # a text tag: the analysis ends at its first occurrence
        return [f"analysis: {head} analysis_text {tail}",
                rf"analysis_text[lazy]: /(.|\n)*/ {_lit(H_END)}"]
    return [f"analysis: {head} ANALYSIS_TEXT {tag(H_END)} {tail}", r"ANALYSIS_TEXT: /(.|\n)*/"]


def harmony_call_rules(spec: ToolCallGrammar, tag: Callable[[str], str]) -> list[str]:
    """Rules of ``call``: one harmony call message of one of ``spec.tools``."""
    rules = ["call: " + " | ".join(f"call_{i}" for i in range(len(spec.tools)))]
    for i, tool in enumerate(spec.tools):
        if not tool.name or any(c.isspace() or c == "<" for c in tool.name):
            raise GrammarError(f"tool name {tool.name!r} cannot be written as a harmony recipient")
        schema = arguments_schema(tool.name, tool.parameters)
        head = _lit(f"commentary to=functions.{tool.name} ")
        rules.append(f"call_{i}: {tag(H_CHANNEL)} {head} {tag(H_CONSTRAIN)} {_lit('json')} "
                     f"{tag(H_MESSAGE)} args_{i}")
        rules.append(f"args_{i}: {json_rule(schema, COMPACT_JSON_OPTIONS)}")
    return rules


def _harmony_grammar(spec: ToolCallGrammar, tag: Callable[[str], str], tag_ref: TagRef) -> str:
    """The harmony form's grammar (module docstring): [analysis message] then one call message."""
    rules = ["start: analysis? call" if spec.reasoning else "start: call"]
    if spec.reasoning:
        rules += harmony_analysis_rules(tag, tag_ref)
    rules += harmony_call_rules(spec, tag)
    return "\n".join(rules) + "\n"


def think_rules(tag_ref: TagRef) -> list[str]:
    """Rules of ``think`` (the rest of an open think block, ``</think>``, up to two newlines)
    and ``nl``."""
    ref = tag_ref(THINK_CLOSE)
    if ref is None:  # a text tag: end the reasoning at its first occurrence
        rules = ["think: think_text nl?", rf"think_text[lazy]: /(.|\n)*/ {_lit(THINK_CLOSE)}"]
    else:
        rules = [f"think: THINK_TEXT {ref} nl?", r"THINK_TEXT: /(.|\n)*/"]
    return rules + [r'nl: "\n" | "\n\n"']


def call_rules(spec: ToolCallGrammar, tag: Callable[[str], str], tag_ref: TagRef) -> list[str]:
    """Rules of ``calls`` (one call, or with ``spec.parallel`` more after up to two newlines
    each) in the json, xml or glm form; they use ``nl`` (see :func:`think_rules`)."""
    rules = ["calls: call (nl? call)*" if spec.parallel else "calls: call"]
    rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(spec.tools))))
    for i, tool in enumerate(spec.tools):
        schema = arguments_schema(tool.name, tool.parameters)
        if spec.form == "json":
            name = json.dumps(tool.name, ensure_ascii=False)
            head = _lit("\n{" + f'"name": {name}, "arguments": ')
            body = f"{head} args_{i} {_ARGS_CLOSE}"
            rules.append(f"args_{i}: {json_rule(schema)}")
        elif spec.form == "glm":
            body = _glm_call(i, tool.name, schema, rules, tag, tag_ref)
        else:
            body = _xml_call(i, tool.name, schema, rules)
        rules.append(f"call_{i}: {tag(TOOL_OPEN)} {body} {tag(TOOL_CLOSE)}")
    return rules


def grammar_text(spec: ToolCallGrammar, tag_ref: TagRef = no_tags) -> str:
    """The Lark grammar of ``spec`` (rules in the module docstring).

    Args:
        spec: the forced-call description.
        tag_ref: maps ``"<tool_call>"``, ``"</tool_call>"`` and ``"</think>"`` to a special-token
            reference when the tokenizer has them as single special tokens (default: text).

    Raises:
        GrammarError: a tool schema is not an object schema, or (xml form) a tool or parameter
            name contains ``<``, ``>`` or a line break, or is blank.
    """
    tag = tag_writer(tag_ref)
    if spec.form == "harmony":
        return _harmony_grammar(spec, tag, tag_ref)
    if spec.reasoning:
        rules = ["start: think calls", *think_rules(tag_ref)]
    else:
        rules = ["start: calls", r'nl: "\n" | "\n\n"']
    rules += call_rules(spec, tag, tag_ref)
    return "\n".join(rules) + "\n"
