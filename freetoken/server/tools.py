"""Tool declarations and ``tool_choice`` of the chat, Responses and Messages APIs, reduced to what
the prompt, the parser and the sampler need.

Tools are kept in the OpenAI chat form ``{"type": "function", "function": {"name",
"description", "parameters"}}`` (the form ChatTemplate renders and OutputParser reads; the
Responses API's flat ``{"type": "function", "name", ...}`` is converted). ``tool_choice``:

* ``auto`` (or absent): calls are parsed, nothing is forced;
* ``none``: tool-call parsing is off while the tools stay in the prompt (a stable prompt prefix
  across turns), so whatever the model writes is text and no call is ever reported;
* OpenAI ``required`` / Anthropic ``any``: decoding is grammar-constrained
  (:mod:`freetoken.constrain`) to one or more calls of the declared tools, arguments valid for
  their schemas (one call when ``parallel_tool_calls`` is false or ``disable_parallel_tool_use``);
* a named function / Anthropic ``tool``: constrained to exactly one call of that tool.

The grammar (:meth:`ToolPolicy.grammar`) follows the chat template's call form (JSON, XML, GLM or
harmony, see :func:`call_form`) and lets a think block the prompt opened finish first (the calls
follow ``</think>``; until then the model reasons freely; harmony: an analysis message may come
first). Generation ends by EOS, allowed only after a complete call, so ``tool_calls`` /
``tool_use`` is reported exactly when a call was parsed; a call cut off by ``max_tokens`` ends
with ``length`` / ``max_tokens``. A structured-output format combines with these choices as
:mod:`freetoken.server.structured` says (a forced call wins; under ``auto`` the calls are the
alternative to the JSON answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from freetoken.constrain import GrammarError, ToolCallGrammar, tool_call_grammar
from freetoken.constrain.matcher import check_grammar
from freetoken.core import SamplingParams
from freetoken.server.anthropic_protocol import CountTokensRequest
from freetoken.server.errors import bad_request
from freetoken.server.openai_protocol import ChatCompletionRequest
from freetoken.server.openai_responses_protocol import FunctionTool, ResponsesRequest

_EMPTY_SCHEMA = {"type": "object", "properties": {}}


def call_form(template: object) -> str:
    """The tool-call form a chat template teaches: ``"harmony"`` when its source writes
    ``<|channel|>`` (gpt-oss), ``"xml"`` when it writes ``<function=`` (Qwen3.5 / Qwen3-Coder),
    ``"glm"`` when it writes ``<arg_key>`` (GLM-4.5), else ``"json"`` (Qwen3 / Qwen3-Next /
    Hermes; also for templates without a ``source``, such as stand-ins)."""
    source = getattr(template, "source", None)
    if not isinstance(source, str):
        return "json"
    if "<|channel|>" in source:
        return "harmony"
    if "<function=" in source:
        return "xml"
    return "glm" if "<arg_key>" in source else "json"


@dataclass(frozen=True)
class ToolPolicy:
    """Tools to render, whether to parse tool calls out of the output and whether one is forced.

    Attributes:
        tools: OpenAI-form tool list (None when the request declares none).
        parse_tools: False when there are no tools or the choice is ``none``.
        require_call: ``tool_choice`` forces at least one call (required / any / named / tool).
        named: the one tool a named choice forces, else None.
        parallel: more than one call may be made (False with ``parallel_tool_calls: false`` or
            ``disable_parallel_tool_use: true``).
    """

    tools: list[dict] | None
    parse_tools: bool
    require_call: bool = False
    named: str | None = None
    parallel: bool = True

    def grammar(self, template: object, in_reasoning: bool) -> ToolCallGrammar | None:
        """The decoding constraint of a forced call (``SamplingParams.grammar``), or None.

        Args:
            template: the chat template (its call form, see :func:`call_form`).
            in_reasoning: the prompt opened a think block (``Prompt.in_reasoning``).

        Raises:
            APIError: 400 (param ``tools``) when a tool schema cannot be compiled into a grammar.
        """
        if not self.require_call or not self.tools:
            return None
        return self.call_grammar(template, in_reasoning)

    def call_grammar(self, template: object, in_reasoning: bool) -> ToolCallGrammar:
        """The grammar of this policy's calls, forced or not (a structured-output answer under
        ``auto`` takes it as its alternative, see :mod:`freetoken.server.structured`).

        Raises:
            APIError: 400 (param ``tools``) when a tool schema cannot be compiled into a grammar.
        """
        try:
            spec = tool_call_grammar(self.tools, call_form(template), only=self.named,
                                     reasoning=in_reasoning, parallel=self.parallel)
            check_grammar(spec)
        except GrammarError as exc:
            raise bad_request(f"tools: {exc}", param="tools") from None
        return spec

    def constrain(self, sampling: SamplingParams, template: object,
                  in_reasoning: bool) -> SamplingParams:
        """``sampling`` with :meth:`grammar` set (unchanged when no call is forced).

        Raises:
            APIError: 400 as :meth:`grammar`.
        """
        grammar = self.grammar(template, in_reasoning)
        return sampling if grammar is None else replace(sampling, grammar=grammar)


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


def _function_policy(tools: list[dict] | None, choice: str | None, named: str | None,
                     named_param: str, parallel: bool | None) -> ToolPolicy:
    """The policy of an OpenAI-style choice (``auto`` / ``none`` / ``required`` or the name a
    named choice forces, reported under ``named_param``)."""
    if choice == "required" and not tools:
        raise bad_request(
            "tool_choice: 'required' needs a non-empty tools list", param="tool_choice"
        )
    if named is not None:
        _check_named(named, tools, named_param)
    return ToolPolicy(
        tools,
        parse_tools=bool(tools) and choice != "none",
        require_call=choice == "required" or named is not None,
        named=named,
        parallel=parallel is not False,
    )


def openai_tools(req: ChatCompletionRequest) -> ToolPolicy:
    """Tool policy of a chat-completions request (``required`` / named choices force a call).

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
    if isinstance(choice, str) or choice is None:
        return _function_policy(tools, choice, None, "", req.parallel_tool_calls)
    return _function_policy(tools, None, choice.function.name, "tool_choice.function.name",
                            req.parallel_tool_calls)


def responses_tools(req: ResponsesRequest, functions: Sequence[FunctionTool]) -> ToolPolicy:
    """Tool policy of a Responses request over its ``functions`` (the flat function tools
    :func:`~freetoken.server.openai_responses_tools.read_tools` kept); ``required`` / named
    choices force a call.

    Raises:
        APIError: 400 as :func:`openai_tools` (a named choice is reported as
            ``tool_choice.name``).
    """
    tools = [_function(t.name, t.description, t.parameters) for t in functions] or None
    choice = req.tool_choice
    if isinstance(choice, str) or choice is None:
        return _function_policy(tools, choice, None, "", req.parallel_tool_calls)
    return _function_policy(tools, None, choice.name, "tool_choice.name", req.parallel_tool_calls)


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
    forced = choice is not None and choice.type in ("any", "tool")
    return ToolPolicy(
        tools,
        parse_tools=bool(tools) and (choice is None or choice.type != "none"),
        require_call=forced,
        named=choice.name if forced and choice.type == "tool" else None,
        parallel=not (choice is not None and choice.disable_parallel_tool_use),
    )
