"""Types XML tool-call parameter values by the tool's JSON schema.

In the XML call form (``<parameter=ARG>\\nVALUE\\n</parameter>``, Qwen3.5 / Qwen3-Coder) every value
is text; the declared JSON-schema type decides what it becomes in the arguments object:

* a type list / ``anyOf`` / ``oneOf`` that allows ``"string"``: the raw text, byte-exact
  (``"03106"`` stays ``"03106"``, ``'{"a": 1}'`` stays a string);
* ``integer``, ``number``, ``boolean``, ``null``, ``object``, ``array``: parsed, trying the allowed
  types in that order; text that parses as none of them is kept as the raw string;
* a declared parameter with no type information: a JSON value when the text is one (object,
  array, number, boolean, null), else the raw string;
* an undeclared parameter or an unknown tool: the raw string.

Non-string values are parsed from the text with surrounding whitespace removed.

In the JSON call form the model already chose JSON types, and :func:`coerce_json_argument` only
repairs a value whose type the schema does not allow: a string holding a number, boolean, null,
object or array the schema asks for is parsed (``"5"`` → 5, ``"true"`` → true, ``'{"a": 1}'`` →
an object), and a number or boolean given for a string-only field becomes its JSON text
(``3106`` → ``"3106"``). Strings the schema allows, values with no schema and values that do not
parse are kept as written.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_INTEGER = re.compile(r"-?\d+")
_TYPE_ORDER = ("integer", "number", "boolean", "null", "object", "array")
_FAIL = object()


def tool_parameter_schemas(tools: list[dict] | None) -> dict[str, dict[str, dict]]:
    """Map each tool name to its JSON-schema ``properties`` (``{}`` when it declares none).

    Accepts OpenAI tools (``{"type": "function", "function": {"name", "parameters"}}``), bare
    function objects (``{"name", "parameters"}``) and Anthropic tools (``{"name", "input_schema"}``).
    Entries without a string name are ignored.
    """
    out: dict[str, dict[str, dict]] = {}
    for tool in tools or []:
        if not isinstance(tool, dict):
            continue
        fn = tool["function"] if isinstance(tool.get("function"), dict) else tool
        name = fn.get("name")
        params = fn.get("parameters", fn.get("input_schema"))
        props = params.get("properties") if isinstance(params, dict) else None
        if isinstance(name, str):
            out[name] = {k: v for k, v in props.items() if isinstance(v, dict)} if isinstance(props, dict) else {}
    return out


def _schema_types(schema: dict) -> set[str]:
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or []:
            if isinstance(sub, dict):
                types |= _schema_types(sub)
    if not types and isinstance(schema.get("enum"), list) and schema["enum"]:
        if all(isinstance(v, str) for v in schema["enum"]):
            types.add("string")
    if not types and "properties" in schema:
        types.add("object")
    if not types and "items" in schema:
        types.add("array")
    return types


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def finite_float(text: str) -> float:
    """``float(text)`` for ``json`` ``parse_float``, refusing numbers that overflow to infinity
    (``1e999``): they would be re-serialised as ``Infinity``, which is not JSON.

    Raises:
        ValueError: the literal does not fit a finite double.
    """
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} does not fit a double")
    return value


def _json(text: str) -> Any:
    try:
        value = json.loads(text, parse_constant=_no_constants, parse_float=finite_float)
    except ValueError:
        return _FAIL
    if isinstance(value, float) and not math.isfinite(value):
        return _FAIL
    return value


def _parse_as(kind: str, text: str) -> Any:
    if kind == "integer":
        return int(text) if _INTEGER.fullmatch(text) else _FAIL
    if kind == "number":
        value = _json(text)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return value if ok else _FAIL
    if kind == "boolean":
        lowered = text.lower()
        return {"true": True, "false": False}.get(lowered, _FAIL)
    if kind == "null":
        return None if text == "null" else _FAIL
    value = _json(text)
    if kind == "object":
        return value if isinstance(value, dict) else _FAIL
    if kind == "array":
        return value if isinstance(value, list) else _FAIL
    return _FAIL


def coerce_parameter(raw: str, schema: dict | None) -> Any:
    """The JSON value of one XML parameter (rules in the module docstring).

    Args:
        raw: the parameter text exactly as generated (framing newlines already removed).
        schema: the parameter's JSON schema, or None when the tool or the parameter is unknown.
    """
    if schema is None:
        return raw
    types = _schema_types(schema)
    if "string" in types:
        return raw
    text = raw.strip()
    if not types:
        value = _json(text)
        return raw if value is _FAIL or isinstance(value, str) else value
    for kind in _TYPE_ORDER:
        if kind in types:
            value = _parse_as(kind, text)
            if value is not _FAIL:
                return value
    return raw


def _json_kinds(value: Any) -> set[str]:
    """JSON-schema type names a decoded JSON value satisfies."""
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"object"} if isinstance(value, dict) else {"array"}


def coerce_json_argument(value: Any, schema: dict | None) -> Any:
    """One top-level argument value of a JSON-form call, typed by its schema (rules in the module
    docstring).

    Args:
        value: the decoded JSON value the model wrote.
        schema: the parameter's JSON schema, or None when the tool or the parameter is unknown.
    """
    if schema is None:
        return value
    types = _schema_types(schema)
    if not types or _json_kinds(value) & types:
        return value
    if isinstance(value, str):
        return coerce_parameter(value, schema)
    if "string" in types and isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return value
