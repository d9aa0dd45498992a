"""Exact renders of templates/glm4_moe.jinja and the prefix properties the engine relies on.

Holds (asserted below): whole appended turns extend the render, and so do tool results appended
one at a time (no turn has an end token); in a tool loop, prompt + generated text is a prefix of
the next prompt (the model's stop token, <|observation|>, comes next) once the text has gone
through OutputParser and the client sent the call back, thinking on or off; with thinking off a
new user turn extends the previous prompt + answer.
Does not hold: with thinking on, a new user turn drops the previous answer's reasoning (the edit
lands right after "<|assistant|>\\n<think>").
"""

from __future__ import annotations

import json
import os

import pytest

from freetoken.chat.template import ChatTemplate, TemplateError
from freetoken.parsers import ReasoningDelta, TextDelta, ToolCallEvent, parse_output
from freetoken.parsers import prompt_opens_reasoning

TOOL_JSON = (
    '{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}, '
    '"timeout": {"type": "integer"}}, "required": ["command"]}}}'
)
TOOLS_TURN = (
    "<|system|>\n# Tools\n\nThese functions are available to you:\n\n<tools>\n" + TOOL_JSON
    + "\n</tools>\n\nTo call a function, write one block per call in exactly this form:\n\n"
    "<tool_call>FUNCTION_NAME\n<arg_key>ARGUMENT_NAME</arg_key>\n<arg_value>VALUE</arg_value>\n"
    "</tool_call>\n\nRules:\n"
    "- The function name follows <tool_call> directly, then one <arg_key>/<arg_value> pair per "
    "argument; a function without arguments gets no pairs.\n"
    "- Write text values as they are; write numbers, booleans, null, objects and arrays as JSON.\n"
    "- If no function is needed, answer normally without any <tool_call> block."
)
START = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Count the files."},
]
GLM_CALL = (
    "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls | wc -l</arg_value>\n"
    "<arg_key>timeout</arg_key>\n<arg_value>5</arg_value>\n</tool_call>"
)


@pytest.fixture(scope="module")
def glm() -> ChatTemplate:
    return ChatTemplate.for_model(None, "glm4_moe")


def _call(name: str, arguments) -> dict:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


def _assistant_from(events: list, compact: bool) -> dict:
    """The assistant message an OpenAI client sends back for these parser events."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = []
    for e in events:
        if isinstance(e, ToolCallEvent):
            args = json.loads(e.arguments)
            calls.append(_call(e.name, json.dumps(args, separators=(",", ":")) if compact
                               else e.arguments))
    message = {"role": "assistant", "content": text or None, "reasoning_content": reasoning or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _divergence(a: str, b: str) -> str:
    """The first 20 characters of ``b`` after its common prefix with ``a``."""
    n = len(os.path.commonprefix([a, b]))
    return b[n : n + 20]


def test_system_tools_user_and_generation_prompt(glm, bash_tool):
    messages = [{"role": "system", "content": "Be careful."}, {"role": "user", "content": "hi"}]
    assert glm.render(messages, tools=[bash_tool]) == (
        "[gMASK]<sop>" + TOOLS_TURN + "<|system|>\nBe careful.<|user|>\nhi<|assistant|>"
    )


@pytest.mark.parametrize(
    "enable_thinking, user, tail",
    [(None, "hi", ""), (True, "hi", ""), (False, "hi/nothink", "\n<think></think>")],
)
def test_generation_prompt_with_and_without_thinking(glm, enable_thinking, user, tail):
    out = glm.render([{"role": "user", "content": "hi"}], enable_thinking=enable_thinking)
    assert out == "[gMASK]<sop><|user|>\n" + user + "<|assistant|>" + tail
    assert prompt_opens_reasoning(out) is False
    bare = glm.render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert bare == "[gMASK]<sop><|user|>\nhi"


def test_nothink_is_not_doubled(glm):
    out = glm.render([{"role": "user", "content": "quick /nothink"}], enable_thinking=False)
    assert out == "[gMASK]<sop><|user|>\nquick /nothink<|assistant|>\n<think></think>"


def test_tool_calls_typed_values_and_one_observation_turn(glm):
    code = "if a < b:\n    print('</tool_call>')\n"
    messages = [
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": "  Editing.  ",
            "reasoning_content": "\n plan \n",
            "tool_calls": [
                _call("write", {"path": "03106.py", "content": code}),
                _call("cfg", '{"opts": {"a": [1, true]}, "n": 2, "on": false, "x": null, '
                             '"u": "é"}'),
                _call("noargs", {}),
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "written"},
        {"role": "tool", "tool_call_id": "c", "content": "set"},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "done"}]},
    ]
    assert glm.render(messages) == (
        "[gMASK]<sop><|user|>\nFix it.<|assistant|>\n<think>plan</think>\nEditing."
        "\n<tool_call>write\n<arg_key>path</arg_key>\n<arg_value>03106.py</arg_value>\n"
        "<arg_key>content</arg_key>\n<arg_value>" + code + "</arg_value>\n</tool_call>"
        '\n<tool_call>cfg\n<arg_key>opts</arg_key>\n<arg_value>{"a": [1, true]}</arg_value>\n'
        "<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n<arg_key>on</arg_key>\n"
        "<arg_value>false</arg_value>\n<arg_key>x</arg_key>\n<arg_value>null</arg_value>\n"
        "<arg_key>u</arg_key>\n<arg_value>é</arg_value>\n</tool_call>"
        "\n<tool_call>noargs\n</tool_call>"
        "<|observation|>\n<tool_response>\nwritten\n</tool_response>"
        "\n<tool_response>\nset\n</tool_response>\n<tool_response>\ndone\n</tool_response>"
        "<|assistant|>"
    )


def test_thinking_drop_rule_and_mid_conversation_system_in_place(glm):
    messages = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "system", "content": "Late system."},
        {"role": "user", "content": [{"type": "text", "text": "Q"}, {"type": "text", "text": "2"}]},
        {"role": "assistant", "content": "<think>\nR2\n</think>\n\nA2"},
        {"role": "assistant", "content": "A3", "reasoning_content": "  R3  "},
    ]
    assert glm.render(messages, add_generation_prompt=False) == (
        "[gMASK]<sop><|user|>\nQ1<|assistant|>\n<think></think>\nA1"
        "<|system|>\nLate system.<|user|>\nQ2"
        "<|assistant|>\n<think>R2</think>\nA2<|assistant|>\n<think>R3</think>\nA3"
    )


def test_empty_assistant_turn_and_conversation_without_user(glm):
    messages = [{"role": "system", "content": "S"}, {"role": "assistant", "content": None}]
    assert glm.render(messages) == (
        "[gMASK]<sop><|system|>\nS<|assistant|>\n<think></think><|assistant|>"
    )


@pytest.mark.parametrize(
    "messages, error",
    [
        (
            [{"role": "user", "content": "Q"},
             {"role": "assistant", "tool_calls": [_call("f", "[1]")]}],
            "chat template glm4_moe: Tool call arguments must be a JSON object (function f).",
        ),
        (
            [{"role": "user", "content": "Q"}, {"role": "assistant", "tool_calls": [{"x": 1}]}],
            "chat template glm4_moe: Every tool call needs a function name.",
        ),
        (
            [{"role": "critic", "content": "Q"}],
            "chat template glm4_moe: Unsupported message role: critic",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "chat template glm4_moe: Only text content parts can be rendered.",
        ),
    ],
)
def test_errors(glm, messages, error):
    with pytest.raises(TemplateError) as err:
        glm.render(messages)
    assert str(err.value) == error


@pytest.mark.parametrize(
    "enable_thinking, generated",
    [
        (None, "\n<think>List, then count.</think>\nCounting.\n" + GLM_CALL),
        (None, "\n<think>Just call.</think>\n" + GLM_CALL),
        (False, "\nCounting.\n" + GLM_CALL),
        (False, "\n" + GLM_CALL),
    ],
)
@pytest.mark.parametrize("compact", [False, True])
def test_tool_loop_history_reproduces_the_generated_text(
    glm, bash_tool, enable_thinking, generated, compact
):
    prompt = glm.render(START, tools=[bash_tool], enable_thinking=enable_thinking)
    events = parse_output(generated, [bash_tool], in_reasoning=prompt_opens_reasoning(prompt))
    (call,) = [e for e in events if isinstance(e, ToolCallEvent)]
    assert (call.name, call.arguments) == ("bash", '{"command": "ls | wc -l", "timeout": 5}')
    history = START + [
        _assistant_from(events, compact),
        {"role": "tool", "tool_call_id": "c", "content": "42"},
    ]
    next_prompt = glm.render(history, tools=[bash_tool], enable_thinking=enable_thinking)
    gen_prompt = "<|assistant|>" + ("\n<think></think>" if enable_thinking is False else "")
    assert next_prompt == (
        prompt + generated + "<|observation|>\n<tool_response>\n42\n</tool_response>" + gen_prompt
    )


@pytest.mark.parametrize(
    "appended",
    [
        [{"role": "assistant", "content": "Done.", "reasoning_content": "easy",
          "tool_calls": [_call("bash", {"command": "ls"})]},
         {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}],
        [{"role": "user", "content": "And the dirs?"}],
        [{"role": "system", "content": "Reminder: be brief."}],
    ],
)
@pytest.mark.parametrize("enable_thinking", [None, False])
def test_whole_turns_extend_the_render(glm, bash_tool, appended, enable_thinking):
    before = glm.render(START, tools=[bash_tool], add_generation_prompt=False,
                        enable_thinking=enable_thinking)
    after = glm.render(START + appended, tools=[bash_tool], enable_thinking=enable_thinking)
    assert after.startswith(before)


def test_thinking_off_new_user_turn_extends_prompt_and_answer(glm):
    prompt = glm.render(START, enable_thinking=False)
    generated = "\nThere are 42."
    events = parse_output(generated, None, in_reasoning=prompt_opens_reasoning(prompt))
    assert events == [TextDelta("There are 42.")]
    history = START + [_assistant_from(events, compact=False), {"role": "user", "content": "Thx"}]
    assert glm.render(history, enable_thinking=False) == (
        prompt + generated + "<|user|>\nThx/nothink<|assistant|>\n<think></think>"
    )


def test_thinking_on_new_user_turn_drops_the_previous_reasoning(glm):
    prompt = glm.render(START)
    generated = "\n<think>Counted.</think>\nThere are 42."
    events = parse_output(generated, None, in_reasoning=prompt_opens_reasoning(prompt))
    assert events == [ReasoningDelta("Counted."), TextDelta("There are 42.")]
    answered = START + [_assistant_from(events, compact=False)]
    assert glm.render(answered, add_generation_prompt=False) == prompt + generated
    after = glm.render(answered + [{"role": "user", "content": "Thanks"}])
    assert after == prompt + "\n<think></think>\nThere are 42.<|user|>\nThanks<|assistant|>"
    assert _divergence(prompt + generated, after) == "</think>\nThere are 4"


def test_tool_results_appended_one_at_a_time_share_one_observation_turn(glm):
    call = {"role": "assistant", "content": "", "tool_calls": [_call("a", {}), _call("b", {})]}
    first = glm.render(START + [call, {"role": "tool", "content": "A"}],
                       add_generation_prompt=False)
    both = glm.render(START + [call, {"role": "tool", "content": "A"},
                               {"role": "tool", "content": "B"}])
    assert both.startswith(first)
    assert both[len(first):] == "\n<tool_response>\nB\n</tool_response><|assistant|>"
