"""Exact renders of templates/qwen3_next.jinja and templates/qwen3_5_moe.jinja."""

from __future__ import annotations

import pytest

from freetoken.chat.template import TemplateError

QWEN3_5_INSTRUCTIONS = (
    "\n</tools>\n\nTo call a function, write one block per call in exactly this form:\n\n"
    "<tool_call>\n<function=FUNCTION_NAME>\n<parameter=PARAMETER_NAME>\nVALUE\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\n- Give every required parameter, each in its own <parameter=...> block.\n"
    "- Write text values as they are, on their own lines; write objects and arrays as JSON.\n"
    "- You may write some text before the first call, but nothing after the last one.\n"
    "- If no function is needed, answer normally without any <tool_call> block.\n</IMPORTANT>"
)


@pytest.mark.parametrize("enable_thinking, tail", [(None, "<think>\n"), (True, "<think>\n"), (False, "<think>\n\n</think>\n\n")])
def test_qwen3_next_generation_prompt_opens_the_think_block(qwen3_next, enable_thinking, tail):
    out = qwen3_next.render([{"role": "user", "content": "hi"}], enable_thinking=enable_thinking)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + tail


def test_qwen3_next_keeps_empty_think_blocks_after_the_last_query(qwen3_next, bash_tool, qwen3_header):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "ls"}}}]},
        {"role": "tool", "content": "x"},
    ]
    assert qwen3_next.render(messages, tools=[bash_tool], enable_thinking=False) == (
        "<|im_start|>system\nS\n\n" + qwen3_header + "<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_qwen3_5_system_tools_user(qwen3_5, bash_tool):
    messages = [{"role": "system", "content": "  Be careful.\n"}, {"role": "user", "content": "hi"}]
    tool_json = (
        '{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", '
        '"parameters": {"type": "object", "properties": {"command": {"type": "string"}, '
        '"timeout": {"type": "integer"}}, "required": ["command"]}}}'
    )
    assert qwen3_5.render(messages, tools=[bash_tool]) == (
        "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n" + tool_json
        + QWEN3_5_INSTRUCTIONS + "\n\nBe careful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_qwen3_5_xml_tool_calls_and_merged_results(qwen3_5):
    code = "if a < b:\n    print('</function>')\n"
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": "  Editing.  ",
            "reasoning_content": "\n plan \n",
            "tool_calls": [
                {"function": {"name": "write", "arguments": {"path": "03106.py", "content": code}}},
                {"function": {"name": "cfg", "arguments": '{"opts": {"a": [1, true]}, "n": 2, "on": false, "x": null}'}},
            ],
        },
        {"role": "tool", "content": "written"},
        {"role": "tool", "content": "set"},
    ]
    assert qwen3_5.render(messages, enable_thinking=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nFix it.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nplan\n</think>\n\nEditing.\n\n"
        "<tool_call>\n<function=write>\n<parameter=path>\n03106.py\n</parameter>\n"
        "<parameter=content>\n" + code + "\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=cfg>\n<parameter=opts>\n{\"a\": [1, true]}\n</parameter>\n"
        "<parameter=n>\n2\n</parameter>\n<parameter=on>\nfalse\n</parameter>\n<parameter=x>\nnull\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nwritten\n</tool_response>\n<tool_response>\nset\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_qwen3_5_history_before_last_query_has_no_think_block_and_mid_system_in_place(qwen3_5):
    messages = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "system", "content": "Late system."},
        {"role": "user", "content": [{"type": "text", "text": "Q2"}]},
    ]
    assert qwen3_5.render(messages) == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>system\nLate system.<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


@pytest.mark.parametrize(
    "messages, error",
    [
        ([{"role": "system", "content": "S"}], "chat template qwen3_5_moe: No user query found in messages."),
        (
            [{"role": "user", "content": "Q"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
            "chat template qwen3_5_moe: Tool call arguments must be a JSON object (function f).",
        ),
    ],
)
def test_qwen3_5_errors(qwen3_5, messages, error):
    with pytest.raises(TemplateError) as err:
        qwen3_5.render(messages)
    assert str(err.value) == error
