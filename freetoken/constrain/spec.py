"""The request-side descriptions of constrained output: a forced tool call (which tools, which
call form, how many) or a JSON answer of a schema (structured outputs).

A :class:`ToolCallGrammar` is what the HTTP layer puts on ``SamplingParams.grammar`` when
``tool_choice`` forces a call (OpenAI ``required`` or a named function, Anthropic ``any`` or
``tool``); a :class:`JsonAnswerGrammar` when the request asks for a JSON answer (OpenAI
``response_format``, Responses ``text.format``, Anthropic ``output_config.format``). Both are
plain, frozen and hashable data (schemas are kept as JSON text), so the engine can cache the
compiled grammar by them; nothing here imports the grammar library.

Call forms (those the output parsers read, see :mod:`freetoken.parsers.toolcall` and
:mod:`freetoken.parsers.harmony`):

* ``"json"``: Qwen3 / Qwen3-Next / Hermes,
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
* ``"xml"``: Qwen3.5 / Qwen3-Coder, ``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n
  </parameter>\\n</function>\\n</tool_call>``;
* ``"glm"``: GLM-4.5, ``<tool_call>NAME\\n<arg_key>ARG</arg_key>\\n<arg_value>VALUE
  </arg_value>\\n</tool_call>``;
* ``"harmony"``: gpt-oss, ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
  {ARGS}`` (then the ``<|call|>`` stop token; :mod:`freetoken.parsers.harmony`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

CallForm = Literal["json", "xml", "glm", "harmony"]
CALL_FORMS: tuple[str, ...] = ("json", "xml", "glm", "harmony")


class GrammarError(ValueError):
    """A grammar cannot be built or compiled (bad tool or answer schema, a name the call form
    cannot write, a schema the grammar library rejects), or a matcher left the grammar."""


@dataclass(frozen=True)
class ToolSchema:
    """One tool the forced call may use.

    Attributes:
        name: the function name, exactly as the call must write it.
        parameters: the JSON schema of its arguments object, as JSON text (key order kept: it is
            the order arguments are written in).
    """

    name: str
    parameters: str


@dataclass(frozen=True)
class ToolCallGrammar:
    """What a constrained generation must produce: one or more tool calls and nothing else.

    The output is, in order: when ``reasoning``, the rest of the think block the prompt opened
    (free text, no special tokens) and ``</think>`` with up to two newlines; then one tool call
    of one of ``tools`` in ``form`` whose arguments match that tool's schema; when ``parallel``,
    any number of further calls (each after up to two newlines); then an end-of-sequence token.
    End of sequence is allowed only once at least one call is complete.

    In the harmony form the reasoning is an optional ``analysis`` message before the call
    message, and there is exactly one call whatever ``parallel`` says: ``<|call|>``, which ends
    a call message, is a stop token.

    Attributes:
        form: the call form of the model's chat template (``"json"``, ``"xml"``, ``"glm"`` or
            ``"harmony"``).
        tools: the tools a call may use (one for a named ``tool_choice``), unique names.
        reasoning: the prompt opened a think block (``Prompt.in_reasoning``): the model finishes
            its reasoning freely and the calls follow ``</think>`` (harmony: the model may write
            an analysis message first).
        parallel: more than one call may follow the first.

    Raises:
        GrammarError: unknown form, no tools, repeated or empty names, or parameters that are
            not the JSON text of an object.
    """

    form: CallForm
    tools: tuple[ToolSchema, ...]
    reasoning: bool = False
    parallel: bool = True

    def __post_init__(self) -> None:
        if self.form not in CALL_FORMS:
            raise GrammarError(
                f"unknown tool-call form {self.form!r}; expected one of {CALL_FORMS}")
        if not self.tools:
            raise GrammarError("a tool-call grammar needs at least one tool")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise GrammarError(f"tool names must be unique, got {names}")
        for tool in self.tools:
            if not isinstance(tool.name, str) or not tool.name:
                raise GrammarError("tool names must be non-empty strings")
            try:
                schema = json.loads(tool.parameters)
            except (TypeError, ValueError) as exc:
                raise GrammarError(f"tool {tool.name!r}: parameters are not JSON: {exc}") from None
            if not isinstance(schema, dict):
                raise GrammarError(f"tool {tool.name!r}: parameters must be a JSON-schema object")


def tool_call_grammar(
    tools: Sequence[dict],
    form: CallForm,
    *,
    only: str | None = None,
    reasoning: bool = False,
    parallel: bool = True,
) -> ToolCallGrammar:
    """Build the grammar description from OpenAI-form tools.

    Args:
        tools: ``[{"type": "function", "function": {"name", "parameters"}}]`` (the form
            ``ChatTemplate`` renders; a missing ``parameters`` means no arguments).
        form: the model's call form.
        only: the tool a named ``tool_choice`` forces (then exactly one call of it), or None for
            any of ``tools``.
        reasoning: the prompt opened a think block.
        parallel: allow more than one call (ignored, False, when ``only`` is given and in the
            harmony form).

    Raises:
        GrammarError: ``only`` names no tool in ``tools``, or the description is invalid (see
            :class:`ToolCallGrammar`).
    """
    specs = []
    for tool in tools:
        fn = tool.get("function", tool)
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        specs.append(ToolSchema(fn.get("name"), json.dumps(params, ensure_ascii=False)))
    if only is not None:
        specs = [s for s in specs if s.name == only]
        if not specs:
            raise GrammarError(f"no tool named {only!r}")
        parallel = False
    if form == "harmony":
        parallel = False
    return ToolCallGrammar(form, tuple(specs), reasoning=reasoning, parallel=parallel)


@dataclass(frozen=True)
class JsonAnswerGrammar:
    """What a structured-output generation must produce: an answer that is one JSON value of a
    schema (``response_format`` / ``text.format`` / ``output_config.format``).

    The output is, in order: when ``reasoning``, the rest of the think block the prompt opened
    and ``</think>`` with up to two newlines (harmony: an optional ``analysis`` message); then
    the answer, one JSON value of ``schema`` (harmony: in a ``final`` message); then an
    end-of-sequence token, allowed once the value is complete. With ``calls`` the answer may
    instead be the tool calls that grammar describes (``tool_choice`` auto: the model either
    calls tools or answers in the schema).

    Attributes:
        form: the chat template's call form (decides the think / harmony framing).
        schema: the answer's JSON schema as JSON text (``{"type": "object"}``: any object).
        reasoning: the prompt opened a think block (``Prompt.in_reasoning``).
        calls: the tool calls allowed instead of the answer, or None; its ``form`` and
            ``reasoning`` are those of this grammar.

    Raises:
        GrammarError: unknown form, a schema that is not the JSON text of an object, or a
            ``calls`` grammar of another form or reasoning.
    """

    form: CallForm
    schema: str
    reasoning: bool = False
    calls: ToolCallGrammar | None = None

    def __post_init__(self) -> None:
        if self.form not in CALL_FORMS:
            raise GrammarError(
                f"unknown tool-call form {self.form!r}; expected one of {CALL_FORMS}")
        try:
            schema = json.loads(self.schema)
        except (TypeError, ValueError) as exc:
            raise GrammarError(f"the schema is not JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise GrammarError("the schema must be a JSON object")
        if self.calls is not None and (self.calls.form, self.calls.reasoning) != (
                self.form, self.reasoning):
            raise GrammarError("the calls grammar must have the answer's form and reasoning")


ANY_OBJECT = json.dumps({"type": "object"})
"""The schema of ``json_object`` formats: any JSON object."""


def json_answer_grammar(schema: dict | None, form: CallForm, *, reasoning: bool = False,
                        calls: ToolCallGrammar | None = None) -> JsonAnswerGrammar:
    """The grammar description of a JSON answer of ``schema`` (None: any object).

    Raises:
        GrammarError: see :class:`JsonAnswerGrammar`.
    """
    text = ANY_OBJECT if schema is None else json.dumps(schema, ensure_ascii=False)
    return JsonAnswerGrammar(form, text, reasoning=reasoning, calls=calls)
