"""Prefix stability of the rendered history, the property prefix/KV caching relies on.

Holds (asserted below):
* render(conv) without the generation prompt is a prefix of render(conv + appended turns) when
  the appended turns are whole: an assistant turn plus all its tool results, a user turn, or a
  system turn;
* in a tool loop, prompt + generated text + "<|im_end|>\\n" is a prefix of the next prompt once the
  generated text has gone through OutputParser and the client has sent the call back (even with
  its arguments re-serialised compactly, as OpenCode and OpenClaw do), for qwen3_moe with
  thinking on, qwen3_next and qwen3_5_moe, thinking on or off.

Does not hold (each case asserted with its exact divergence point):
1. a new user query drops the reasoning of every assistant turn before it (all three templates);
2. qwen3_moe renders an empty think block only while the assistant turn is the last message, so
   with enable_thinking=false (or empty reasoning) a tool loop re-renders the previous turn
   without it (the format's own flicker; qwen3_next and qwen3_5_moe always keep the block);
3. tool results appended one at a time: consecutive tool messages share one user turn, so the
   first result's "<|im_end|>" becomes "\\n<tool_response>…".
"""

from __future__ import annotations

import json
import os

import pytest

from freetoken.parsers import ReasoningDelta, TextDelta, ToolCallEvent, parse_output, prompt_opens_reasoning


def _assistant_from(events: list, compact: bool) -> dict:
    """The assistant message an OpenAI client sends back for these parser events."""
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    calls = []
    for e in events:
        if isinstance(e, ToolCallEvent):
            args = json.dumps(json.loads(e.arguments), separators=(",", ":")) if compact else e.arguments
            calls.append({"id": f"call_{e.index}", "type": "function", "function": {"name": e.name, "arguments": args}})
    message = {"role": "assistant", "content": text or None, "reasoning_content": reasoning or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _divergence(a: str, b: str) -> str:
    """The first 20 characters of ``b`` after its common prefix with ``a``."""
    n = len(os.path.commonprefix([a, b]))
    return b[n : n + 20]


START = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Count the files."}]
JSON_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls | wc -l", "timeout": 5}}\n</tool_call>'
XML_CALL = (
    "<tool_call>\n<function=bash>\n<parameter=command>\nls | wc -l\n</parameter>\n"
    "<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call>"
)


@pytest.mark.parametrize(
    "fixture, enable_thinking, generated",
    [
        ("qwen3", None, "<think>\nList, then count.\n</think>\n\nCounting.\n" + JSON_CALL),
        ("qwen3", None, "<think>\nJust call.\n</think>\n\n" + JSON_CALL),
        ("qwen3_next", None, "List, then count.\n</think>\n\nCounting.\n" + JSON_CALL),
        ("qwen3_next", False, "Counting.\n" + JSON_CALL),
        ("qwen3_5", None, "List, then count.\n</think>\n\nCounting.\n\n" + XML_CALL),
        ("qwen3_5", False, XML_CALL),
    ],
)
@pytest.mark.parametrize("compact", [False, True])
def test_tool_loop_history_reproduces_the_generated_text(request, bash_tool, fixture, enable_thinking, generated, compact):
    tpl = request.getfixturevalue(fixture)
    prompt = tpl.render(START, tools=[bash_tool], enable_thinking=enable_thinking)
    events = parse_output(generated, [bash_tool], in_reasoning=prompt_opens_reasoning(prompt))
    assert [type(e) for e in events if isinstance(e, ToolCallEvent)] == [ToolCallEvent]
    history = START + [
        _assistant_from(events, compact),
        {"role": "tool", "tool_call_id": "call_0", "content": "42"},
    ]
    next_prompt = tpl.render(history, tools=[bash_tool], enable_thinking=enable_thinking)
    assert next_prompt.startswith(prompt + generated + "<|im_end|>\n")
    assert next_prompt.endswith("<tool_response>\n42\n</tool_response><|im_end|>\n" + prompt[prompt.rindex("<|im_start|>"):])


@pytest.mark.parametrize("fixture", ["qwen3", "qwen3_next", "qwen3_5"])
@pytest.mark.parametrize(
    "appended",
    [
        [{"role": "assistant", "content": "Done.", "reasoning_content": "easy",
          "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "ls"}}}]},
         {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}],
        [{"role": "user", "content": "And the dirs?"}],
        [{"role": "system", "content": "Reminder: be brief."}],
    ],
)
def test_whole_turns_extend_the_render(request, bash_tool, fixture, appended):
    tpl = request.getfixturevalue(fixture)
    before = tpl.render(START, tools=[bash_tool], add_generation_prompt=False)
    after = tpl.render(START + appended, tools=[bash_tool])
    assert after.startswith(before)


@pytest.mark.parametrize("fixture", ["qwen3", "qwen3_next", "qwen3_5"])
def test_new_user_query_drops_previous_reasoning(request, fixture):
    tpl = request.getfixturevalue(fixture)
    answered = START + [{"role": "assistant", "content": "There are 42.", "reasoning_content": "Counted."}]
    before = tpl.render(answered, add_generation_prompt=False)
    after = tpl.render(answered + [{"role": "user", "content": "Thanks"}])
    assert not after.startswith(before)
    assert before.endswith("<|im_start|>assistant\n<think>\nCounted.\n</think>\n\nThere are 42.<|im_end|>\n")
    assert after.endswith("<|im_start|>assistant\nThere are 42.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n"
                          + after[after.rindex("<|im_start|>"):])
    assert _divergence(before, after) == "There are 42.<|im_en"


def test_qwen3_empty_think_block_flickers_in_a_non_thinking_tool_loop(qwen3, bash_tool):
    prompt = qwen3.render(START, tools=[bash_tool], enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    events = parse_output(JSON_CALL, [bash_tool], in_reasoning=prompt_opens_reasoning(prompt))
    history = START + [_assistant_from(events, compact=False), {"role": "tool", "content": "42"}]
    next_prompt = qwen3.render(history, tools=[bash_tool], enable_thinking=False)
    assert not next_prompt.startswith(prompt)
    empty_block = "<think>\n\n</think>\n\n"
    assert next_prompt.startswith(prompt[: -len(empty_block)] + JSON_CALL + "<|im_end|>\n")


@pytest.mark.parametrize("fixture", ["qwen3", "qwen3_next", "qwen3_5"])
def test_tool_results_appended_one_at_a_time_are_merged(request, fixture):
    tpl = request.getfixturevalue(fixture)
    call = {"role": "assistant", "content": "", "reasoning_content": "two calls",
            "tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}]}
    first = tpl.render(START + [call, {"role": "tool", "content": "A"}], add_generation_prompt=False)
    both = tpl.render(START + [call, {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"}])
    assert not both.startswith(first)
    assert first.endswith("<tool_response>\nA\n</tool_response><|im_end|>\n")
    assert _divergence(first, both) == "\n<tool_response>\nB\n<"
