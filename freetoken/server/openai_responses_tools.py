"""``tools[]`` of a Responses request: what the model can call, and what is left out.

Agents built on the Responses API (Codex CLI first) declare more than function tools. This
server only runs a model, so each declared type is handled so the agent keeps working:

* ``function``: rendered as it is (fields validated, errors name ``tools.<i>.<field>``);
* ``custom`` (a free-form tool whose call carries one text ``input``, e.g. Codex's
  ``apply_patch``): rendered as a function with one string parameter ``input`` (the format's
  grammar, when given, is quoted in its description as guidance); a call of it is answered as a
  ``custom_tool_call`` item, the shape the agent waits for;
* anything else (``web_search``, ``local_shell``, ``namespace`` groups, ``file_search``,
  ``mcp``, ...): dropped, with one log line per request naming what was dropped. These are
  hosted tools or groups the agent cannot receive as plain function calls; hiding them is
  what an agent expects from a provider without them.

A tool that is not an object, or an object without a string ``type``, is a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from freetoken.server.errors import bad_request, from_validation_error
from freetoken.server.openai_responses_protocol import FunctionTool

CUSTOM_INPUT = "input"


@dataclass(frozen=True)
class ResponsesToolset:
    """The request's tools as the model sees them.

    Attributes:
        functions: function tools to render (custom tools included in their function form).
        custom: names of the custom tools (their calls become ``custom_tool_call`` items).
        dropped: ``"<type>[ <name>] (tools.<i>)"`` for every tool left out, in order.
    """

    functions: tuple[FunctionTool, ...] = ()
    custom: frozenset[str] = frozenset()
    dropped: tuple[str, ...] = ()


def _custom_function(tool: dict[str, Any], where: str) -> FunctionTool:
    """The function form of a ``custom`` tool (see module docstring)."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where}.name: Field required", param=f"{where}.name")
    description = tool.get("description") if isinstance(tool.get("description"), str) else ""
    fmt = tool.get("format") if isinstance(tool.get("format"), dict) else {}
    definition = fmt.get("definition")
    if fmt.get("type") == "grammar" and isinstance(definition, str):
        syntax = fmt.get("syntax") or "grammar"
        description += f"\n\nThe input must follow this {syntax} grammar:\n{definition}"
    schema = {"type": "object",
              "properties": {CUSTOM_INPUT: {"type": "string",
                                            "description": "the raw input of the tool"}},
              "required": [CUSTOM_INPUT], "additionalProperties": False}
    return FunctionTool(type="function", name=name, description=description.strip() or None,
                        parameters=schema)


def read_tools(raw: list[Any] | None) -> ResponsesToolset:
    """Sort the declared tools (see module docstring).

    Raises:
        APIError: 400 for a tool that is not an object or has no string ``type``, an invalid
            function tool, or a custom tool without a name.
    """
    functions: list[FunctionTool] = []
    custom: set[str] = set()
    dropped: list[str] = []
    for i, tool in enumerate(raw or []):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise bad_request(f"{where}: Input should be an object", param=where)
        kind = tool.get("type")
        if not isinstance(kind, str):
            raise bad_request(f"{where}.type: Field required", param=f"{where}.type")
        if kind == "function":
            try:
                functions.append(FunctionTool.model_validate(tool))
            except ValidationError as exc:
                raise from_validation_error(exc, prefix=where) from None
        elif kind == "custom":
            functions.append(_custom_function(tool, where))
            custom.add(functions[-1].name)
        else:
            name = tool.get("name")
            dropped.append(f"{kind} {name} ({where})" if isinstance(name, str) else
                           f"{kind} ({where})")
    return ResponsesToolset(tuple(functions), frozenset(custom), tuple(dropped))


def custom_input(arguments: str) -> str:
    """The ``input`` text of a custom tool call from the function arguments the model wrote
    (JSON ``{"input": ...}``); arguments of another shape are passed on as they are."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return value[CUSTOM_INPUT]
    return arguments
