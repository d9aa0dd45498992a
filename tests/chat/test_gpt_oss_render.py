"""Exact renders of templates/gpt_oss.jinja (harmony) and the prefix property of its tool loop.

Expected strings follow the harmony format description (openai/harmony docs/format.md): the
system message (identity, dates, ``Reasoning:``, channels, the functions rule), the developer
message (instructions, TypeScript-like tool types in ``namespace functions``), user turns,
analysis / commentary / final assistant messages, tool calls ending ``<|call|>``, tool results
authored ``functions.NAME to=assistant`` and the ``<|start|>assistant`` generation prompt.
Holds (asserted below): in a tool loop, prompt + generated text + ``<|call|>`` is a prefix of the
next prompt once the text has gone through HarmonyParser and an OpenAI client sent the turn back.
Does not hold: once a turn ends in a final answer its analysis is dropped on the next request.
"""

from __future__ import annotations

import datetime
import json

import pytest

from freetoken.chat.template import ChatTemplate, TemplateError
from freetoken.parsers import ReasoningDelta, TextDelta, ToolCallEvent, parse_harmony

SYSTEM = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: {effort}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)
FUNCTIONS_RULE = "\nCalls to these tools must go to the commentary channel: 'functions'."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Gets the current weather in the provided location.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string",
                             "description": "The city and state, e.g. San Francisco, CA"},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"],
                           "default": "celsius"},
            },
            "required": ["location"],
        },
    },
}
LOCATION = {"type": "function", "function": {"name": "get_location",
                                             "description": "Gets the location of the user."}}
TOOLS_SECTION = (
    "# Tools\n\n## functions\n\nnamespace functions {\n\n"
    "// Gets the current weather in the provided location.\n"
    "type get_current_weather = (_: {\n"
    "// The city and state, e.g. San Francisco, CA\n"
    "location: string,\n"
    'format?: "celsius" | "fahrenheit", // default: celsius\n'
    "}) => any;\n\n"
    "// Gets the location of the user.\n"
    "type get_location = () => any;\n\n"
    "} // namespace functions"
)
DATE = {"current_date": "2025-06-28"}


@pytest.fixture(scope="module")
def oss() -> ChatTemplate:
    return ChatTemplate.for_model(None, "gpt_oss")


def _call(name: str, arguments, call_id: str = "c1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_system_developer_tools_user_and_generation_prompt(oss):
    messages = [{"role": "system", "content": "Use a friendly tone."},
                {"role": "user", "content": "What is the weather like in SF?"}]
    out = oss.render(messages, tools=[WEATHER, LOCATION], reasoning_effort="high", **DATE)
    assert out == (
        SYSTEM.format(effort="high") + FUNCTIONS_RULE + "<|end|>"
        "<|start|>developer<|message|># Instructions\n\nUse a friendly tone.\n\n"
        + TOOLS_SECTION + "<|end|>"
        "<|start|>user<|message|>What is the weather like in SF?<|end|><|start|>assistant"
    )


def test_no_system_no_tools_has_no_developer_message(oss):
    out = oss.render([{"role": "user", "content": "What is 2 + 2?"}], **DATE)
    assert out == (SYSTEM.format(effort="medium") + "<|end|>"
                   "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant")
    bare = oss.render([{"role": "user", "content": "hi"}], add_generation_prompt=False, **DATE)
    assert bare.endswith("<|start|>user<|message|>hi<|end|>")


def test_tools_without_instructions(oss):
    out = oss.render([{"role": "user", "content": "u"}], tools=[LOCATION], **DATE)
    assert ("<|end|><|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions"
            " {\n\n// Gets the location of the user.\ntype get_location = () => any;\n\n"
            "} // namespace functions<|end|><|start|>user") in out


@pytest.mark.parametrize("kwargs, level", [
    ({}, "medium"), ({"enable_thinking": True}, "medium"), ({"enable_thinking": False}, "low"),
    ({"reasoning_effort": "low"}, "low"),
    ({"reasoning_effort": "high", "enable_thinking": False}, "high"),
])
def test_reasoning_level(oss, kwargs, level):
    out = oss.render([{"role": "user", "content": "x"}], **kwargs, **DATE)
    assert f"\n\nReasoning: {level}\n\n" in out


def test_bad_reasoning_effort_is_a_template_error(oss):
    with pytest.raises(TemplateError, match="reasoning_effort must be low, medium or high"):
        oss.render([{"role": "user", "content": "x"}], reasoning_effort="extreme")


def test_current_date_defaults_to_today(oss):
    before = datetime.date.today().isoformat()
    out = oss.render([{"role": "user", "content": "x"}])
    after = datetime.date.today().isoformat()
    assert f"\nCurrent date: {before}\n" in out or f"\nCurrent date: {after}\n" in out
    custom = oss.render([{"role": "user", "content": "x"}], model_identity="You are Bot.",
                        knowledge_cutoff="2025-01", **DATE)
    assert custom.startswith("<|start|>system<|message|>You are Bot.\nKnowledge cutoff: 2025-01\n")


def test_tool_call_with_reasoning_and_result_in_an_ongoing_loop(oss):
    messages = [
        {"role": "system", "content": "Use a friendly tone."},
        {"role": "user", "content": "What is the weather like in SF?"},
        {"role": "assistant", "content": None, "reasoning_content": "Need to use function.",
         "tool_calls": [_call("get_current_weather", '{"location": "San Francisco"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sunny": true, "temperature": 20}'},
    ]
    out = oss.render(messages, tools=[WEATHER, LOCATION], reasoning_effort="high", **DATE)
    assert out.endswith(
        "<|start|>user<|message|>What is the weather like in SF?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need to use function.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_current_weather "
        '<|constrain|>json<|message|>{"location":"San Francisco"}<|call|>'
        "<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>"
        '{"sunny": true, "temperature": 20}<|end|><|start|>assistant'
    )


def test_reasoning_of_finished_turns_is_dropped(oss):
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "", "reasoning_content": "R1",
         "tool_calls": [_call("get_location", {})]},
        {"role": "tool", "tool_call_id": "c1", "content": "Paris"},
        {"role": "assistant", "content": "You are in Paris.", "reasoning_content": "R2"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "", "reasoning_content": "R3",
         "tool_calls": [_call("get_location", {}, "c2")]},
        {"role": "tool", "tool_call_id": "c2", "content": "Rome"},
    ]
    out = oss.render(messages, tools=[LOCATION], **DATE)
    turns = out[out.index("<|start|>user"):]
    assert turns == (
        "<|start|>user<|message|>q1<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_location <|constrain|>json"
        "<|message|>{}<|call|>"
        "<|start|>functions.get_location to=assistant<|channel|>commentary<|message|>Paris<|end|>"
        "<|start|>assistant<|channel|>final<|message|>You are in Paris.<|end|>"
        "<|start|>user<|message|>q2<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>R3<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_location <|constrain|>json"
        "<|message|>{}<|call|>"
        "<|start|>functions.get_location to=assistant<|channel|>commentary<|message|>Rome<|end|>"
        "<|start|>assistant"
    )


def test_preamble_parallel_calls_and_results_by_id_then_position(oss):
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Checking both.", "tool_calls": [
            _call("get_current_weather", {"location": "Oslo", "format": "celsius"}, "a"),
            _call("get_location", "not json", "b"),
        ]},
        {"role": "tool", "tool_call_id": "b", "content": "Oslo"},
        {"role": "tool", "tool_call_id": "unknown", "content": [{"type": "text", "text": "5C"}]},
    ]
    out = oss.render(messages, tools=[WEATHER, LOCATION], **DATE)
    assert out.endswith(
        "<|start|>user<|message|>go<|end|>"
        "<|start|>assistant<|channel|>commentary<|message|>Checking both.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_current_weather "
        '<|constrain|>json<|message|>{"location":"Oslo","format":"celsius"}<|call|>'
        "<|start|>assistant<|channel|>commentary to=functions.get_location <|constrain|>json"
        "<|message|>not json<|call|>"
        "<|start|>functions.get_location to=assistant<|channel|>commentary<|message|>Oslo<|end|>"
        "<|start|>functions.get_location to=assistant<|channel|>commentary<|message|>5C<|end|>"
        "<|start|>assistant"
    )


def test_later_system_messages_render_in_place_as_developer_messages(oss):
    messages = [{"role": "user", "content": "u1"}, {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": "Use tabs."}, {"role": "user", "content": "u2"}]
    out = oss.render(messages, **DATE)
    assert out.endswith(
        "<|start|>user<|message|>u1<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nUse tabs.<|end|>"
        "<|start|>user<|message|>u2<|end|><|start|>assistant"
    )


def test_schema_types(oss):
    tool = {"type": "function", "function": {
        "name": "edit",
        "description": "Edit a file.\nSecond line.",
        "parameters": {
            "properties": {
                "path": {"type": "string"},
                "count": {"type": "integer", "default": 3},
                "ratio": {"type": ["number", "null"]},
                "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
                "any_list": {"type": "array"},
                "mode": {"anyOf": [{"type": "string"}, {"type": "boolean"}], "default": "x"},
                "opts": {"type": "object", "description": "Options.", "properties": {
                    "deep": {"type": "boolean", "description": "Go deep.", "nullable": True},
                }, "required": ["deep"]},
                "free": {"type": "object"},
                "level": {"const": 2},
                "whatever": {},
            },
            "required": ["path"],
        },
    }}
    out = oss.render([{"role": "user", "content": "x"}], tools=[tool], **DATE)
    assert (
        "// Edit a file.\n// Second line.\ntype edit = (_: {\n"
        "path: string,\n"
        "count?: number, // default: 3\n"
        "ratio?: number | null,\n"
        'tags?: ("a" | "b")[],\n'
        "any_list?: Array<any>,\n"
        'mode?: string | boolean, // default: "x"\n'
        "// Options.\n"
        "opts?: {\n"
        "    // Go deep.\n"
        "    deep: boolean | null,\n"
        "    },\n"
        "free?: object,\n"
        "level?: 2,\n"
        "whatever?: any,\n"
        "}) => any;\n\n} // namespace functions"
    ) in out


def test_a_tool_result_without_a_call_is_refused(oss):
    with pytest.raises(TemplateError, match="must follow an assistant message with tool calls"):
        oss.render([{"role": "user", "content": "x"},
                    {"role": "tool", "tool_call_id": "c", "content": "y"}])


def _echoed(events: list) -> dict:
    """The assistant message an OpenAI client sends back for these parser events."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = [_call(e.name, e.arguments, f"c{e.index}") for e in events
             if isinstance(e, ToolCallEvent)]
    message = {"role": "assistant", "content": text or None, "reasoning_content": reasoning}
    return {**message, "tool_calls": calls} if calls else message


@pytest.mark.parametrize("generated", [
    '<|channel|>analysis<|message|>List them.<|end|><|start|>assistant<|channel|>commentary '
    'to=functions.bash <|constrain|>json<|message|>{"command":"ls -la","timeout":5}',
    '<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{"command":"é \\"q\\""}',
    '<|channel|>analysis<|message|>Tell them.<|end|><|start|>assistant<|channel|>commentary'
    '<|message|>Running ls.<|end|><|start|>assistant<|channel|>commentary to=functions.bash '
    '<|constrain|>json<|message|>{"command":"ls"}',
])
def test_tool_loop_prompt_extends_prompt_plus_output(oss, bash_tool, generated):
    history = [{"role": "system", "content": "You are a coding agent."},
               {"role": "user", "content": "List the files."}]
    prompt = oss.render(history, tools=[bash_tool], **DATE)
    events = parse_harmony(generated, [bash_tool])
    assert isinstance(events[-1], ToolCallEvent)
    reply = _echoed(events)
    result = {"role": "tool", "tool_call_id": "c0", "content": "a.txt"}
    following = oss.render(history + [reply, result], tools=[bash_tool], **DATE)
    assert following == (
        prompt + generated + "<|call|><|start|>functions.bash to=assistant<|channel|>commentary"
        "<|message|>a.txt<|end|><|start|>assistant"
    )
    assert json.loads(reply["tool_calls"][0]["function"]["arguments"])["command"]


@pytest.mark.parametrize("effort", [{}, {"reasoning_effort": "high"}, {"enable_thinking": False}])
@pytest.mark.parametrize("with_tools", [False, True])
def test_same_text_as_transformers(bash_tool, effort, with_tools):
    """The template needs nothing of FreeToken's sandbox: transformers renders it the same."""
    import transformers

    from freetoken.paths import ASSETS_DIR, TEMPLATES_DIR

    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(ASSETS_DIR / "tokenizer" / "tokenizer.json"))
    source = (TEMPLATES_DIR / "gpt_oss.jinja").read_text(encoding="utf-8")
    messages = [
        {"role": "system", "content": "Sys ü"},
        {"role": "user", "content": [{"type": "text", "text": "Q"}, {"type": "text", "text": "2"}]},
        {"role": "system", "content": "mid"},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "r", "tool_calls": [
            _call("bash", {"command": "ls <dir> & echo 'é'"}, "1"),
            _call("get_current_weather", {"location": "Oslo"}, "2")]},
        {"role": "tool", "tool_call_id": "2", "content": "sunny"},
        {"role": "tool", "tool_call_id": "1", "content": "a"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "dropped"},
        {"role": "user", "content": "next"},
    ]
    tools = [bash_tool, WEATHER, LOCATION] if with_tools else None
    expected = hf.apply_chat_template(messages, tools=tools, chat_template=source, tokenize=False,
                                      add_generation_prompt=True, **effort, **DATE)
    ours = ChatTemplate(source, flatten_text_parts=False).render(messages, tools=tools, **effort,
                                                                 **DATE)
    assert ours == expected


def test_gpt_oss_takes_the_bundled_template_over_the_checkpoints() -> None:
    released = "{{ messages[0].thinking }}"  # stands for the release's own template
    assert ChatTemplate.for_model(released, "gpt_oss").name == "gpt_oss"
    assert ChatTemplate.for_model(released, "qwen3_next").name == "checkpoint"
