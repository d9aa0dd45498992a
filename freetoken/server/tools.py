"""Tool declarations and ``tool_choice`` of both APIs, reduced to what the prompt and parser need.

Tools are kept in the OpenAI form ``{"type": "function", "function": {"name", "description",
"parameters"}}`` (the form ChatTemplate renders and OutputParser reads). ``tool_choice`` cannot
constrain decoding here (no grammar-guided sampling): ``none`` turns tool-call parsing off while the
tools stay in the prompt (a stable prompt prefix across turns); ``required``/``any``/named choices
are validated and parsed like ``auto``, and a response without a call is reported honestly.
"""

from __future__ import annotations

from dataclasses import dataclass

from freetoken.server.anthropic_protocol import CountTokensRequest
from freetoken.server.errors import bad_request
from freetoken.server.openai_protocol import ChatCompletionRequest

_EMPTY_SCHEMA = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPolicy:
    """Tools to render and whether to parse tool calls out of the output.

    Attributes:
        tools: OpenAI-form tool list (None when the request declares none).
        parse_tools: False when there are no tools or the choice is ``none``.
    """

    tools: list[dict] | None
    parse_tools: bool


def _function(name: str, description: str | None, parameters: dict | None) -> dict:
    fn: dict = {"name": name}
    if description is not None:
        fn["description"] = description
    fn["parameters"] = parameters if parameters is not None else dict(_EMPTY_SCHEMA)
    return {"type": "function", "function": fn}


def _check_named(name: str, tools: list[dict] | None, param: str) -> None:
    names = [t["function"]["name"] for t in tools or []]
    if name not in names:
        raise bad_request(f"{param}: no tool named {name!r} in tools", param=param)


def openai_tools(req: ChatCompletionRequest) -> ToolPolicy:
    """Tool policy of a chat-completions request.

    Raises:
        APIError: 400 when ``tool_choice`` is ``required``/named without tools, or names a tool
            that is not declared.
    """
    tools = (
        [
            _function(t.function.name, t.function.description, t.function.parameters)
            for t in req.tools
        ]
        if req.tools
        else None
    )
    choice = req.tool_choice
    if choice == "required" and not tools:
        raise bad_request(
            "tool_choice: 'required' needs a non-empty tools list", param="tool_choice"
        )
    if choice is not None and not isinstance(choice, str):
        _check_named(choice.function.name, tools, "tool_choice.function.name")
    return ToolPolicy(tools, parse_tools=bool(tools) and choice != "none")


def anthropic_tools(req: CountTokensRequest) -> ToolPolicy:
    """Tool policy of a Messages request (``any`` ≈ required, ``tool`` ≈ named).

    Raises:
        APIError: 400 for server tools (a ``type`` other than ``custom``), ``any``/``tool``
            without tools, or ``tool`` naming an undeclared or missing tool.
    """
    tools = None
    if req.tools:
        for i, tool in enumerate(req.tools):
            if tool.type not in (None, "custom"):
                raise bad_request(
                    f"tools.{i}.type: server tool {tool.type!r} is not supported",
                    param=f"tools.{i}.type",
                )
        tools = [_function(t.name, t.description, t.input_schema) for t in req.tools]
    choice = req.tool_choice
    if choice is not None and choice.type in ("any", "tool") and not tools:
        raise bad_request(
            f"tool_choice: {choice.type!r} needs a non-empty tools list", param="tool_choice"
        )
    if choice is not None and choice.type == "tool":
        if not choice.name:
            raise bad_request("tool_choice.name: Field required", param="tool_choice.name")
        _check_named(choice.name, tools, "tool_choice.name")
    return ToolPolicy(tools, parse_tools=bool(tools) and (choice is None or choice.type != "none"))
