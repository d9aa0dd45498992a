"""Exact renders of templates/qwen3_moe.jinja (format of model-architectures.md §7.3)."""

from __future__ import annotations

import pytest

from freetoken.chat.template import ChatTemplate, TemplateError


def test_system_tools_user(qwen3, bash_tool, qwen3_header):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List files."}]
    assert qwen3.render(messages, tools=[bash_tool]) == (
        "<|im_start|>system\nYou are terse.\n\n" + qwen3_header
        + "<|im_start|>user\nList files.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_without_system_message(qwen3, bash_tool, qwen3_header):
    out = qwen3.render([{"role": "user", "content": "hi"}], tools=[bash_tool], add_generation_prompt=False)
    assert out == "<|im_start|>system\n" + qwen3_header + "<|im_start|>user\nhi<|im_end|>\n"


def test_plain_chat_without_tools(qwen3):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert qwen3.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )


def test_assistant_reasoning_and_tool_calls_then_merged_tool_responses(qwen3):
    messages = [
        {"role": "user", "content": "Check the disk."},
        {
            "role": "assistant",
            "content": "Running two commands.",
            "reasoning_content": "\nNeed df and du.\n",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"command":"df -h"}'}},
                {"id": "b", "type": "function", "function": {"name": "bash", "arguments": {"command": "du -s ."}}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "/dev/sda1 50%"},
        {"role": "tool", "tool_call_id": "b", "content": "1234\t."},
    ]
    assert qwen3.render(messages) == (
        "<|im_start|>user\nCheck the disk.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed df and du.\n</think>\n\nRunning two commands.\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "df -h"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "bash", "arguments": {"command": "du -s ."}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n/dev/sda1 50%\n</tool_response>\n"
        "<tool_response>\n1234\t.\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_null_content_with_tool_call_has_no_separator(qwen3):
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "bash", "arguments": {}}}]},
        {"role": "tool", "content": "ok"},
    ]
    assert qwen3.render(messages, add_generation_prompt=False) == (
        "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
    )


def test_string_arguments_that_are_not_json_are_rendered_verbatim(qwen3):
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
    ]
    assert qwen3.render(messages, add_generation_prompt=False) == (
        "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        '<tool_call>\n{"name": "f", "arguments": {oops}\n</tool_call><|im_end|>\n'
    )


def test_string_arguments_kept_verbatim_when_parsing_is_off():
    tpl = ChatTemplate.for_model(None, "qwen3_moe", parse_tool_arguments=False)
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"a":1}'}}]},
        {"role": "tool", "content": "x"},
    ]
    assert '{"name": "f", "arguments": {"a":1}}' in tpl.render(messages)


def test_history_reasoning_is_dropped_before_the_last_query(qwen3):
    messages = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2", "reasoning_content": "R2"},
    ]
    assert qwen3.render(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nR2\n</think>\n\nA2<|im_end|>\n"
    )


def test_reasoning_written_inline_in_content_is_split(qwen3):
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nAnswer"},
    ]
    assert qwen3.render(messages, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nAnswer<|im_end|>\n"
    )


def test_tool_response_wrapped_user_message_is_not_a_query(qwen3):
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A", "reasoning_content": "R"},
        {"role": "user", "content": "<tool_response>\nout\n</tool_response>"},
    ]
    out = qwen3.render(messages, add_generation_prompt=False)
    assert "<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n" in out


def test_mid_conversation_system_message_renders_in_place(qwen3, bash_tool, qwen3_header):
    messages = [
        {"role": "system", "content": "Main prompt."},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Agents: explore, plan."},
        {"role": "user", "content": "again"},
    ]
    assert qwen3.render(messages, tools=[bash_tool]) == (
        "<|im_start|>system\nMain prompt.\n\n" + qwen3_header + "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>system\nAgents: explore, plan.<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_consecutive_user_messages_render_as_separate_turns(qwen3):
    messages = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    assert qwen3.render(messages, add_generation_prompt=False) == (
        "<|im_start|>user\none<|im_end|>\n<|im_start|>user\ntwo<|im_end|>\n"
    )


@pytest.mark.parametrize("enable_thinking, tail", [(False, "<think>\n\n</think>\n\n"), (True, ""), (None, "")])
def test_enable_thinking_generation_prompt(qwen3, enable_thinking, tail):
    out = qwen3.render([{"role": "user", "content": "hi"}], enable_thinking=enable_thinking)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" + tail


def test_list_content_parts_are_concatenated(qwen3):
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Sys "}, {"type": "text", "text": "prompt"}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "tool", "content": [{"type": "text", "text": "out"}]},
    ]
    expected = (
        "<|im_start|>system\nSys prompt<|im_end|>\n<|im_start|>user\nab<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nout\n</tool_response><|im_end|>\n"
    )
    assert qwen3.render(messages, add_generation_prompt=False) == expected
    unflattened = ChatTemplate.for_model(None, "qwen3_moe", flatten_text_parts=False)
    assert unflattened.render(messages, add_generation_prompt=False) == expected


def test_non_text_content_part_is_a_template_error():
    tpl = ChatTemplate.for_model(None, "qwen3_moe")
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(TemplateError) as err:
        tpl.render(messages)
    assert str(err.value) == "chat template qwen3_moe: Only text content parts can be rendered."


def test_unknown_role_is_a_template_error(qwen3):
    with pytest.raises(TemplateError) as err:
        qwen3.render([{"role": "user", "content": "x"}, {"role": "critic", "content": "y"}])
    assert str(err.value) == "chat template qwen3_moe: Unsupported message role: critic"


def test_tool_call_without_name_is_a_template_error(qwen3):
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {}}]}]
    with pytest.raises(TemplateError) as err:
        qwen3.render(messages)
    assert str(err.value) == "chat template qwen3_moe: Every tool call needs a function name."


def test_render_tokenizes_boundaries_as_single_added_tokens(qwen3, bash_tool, tiny_tokenizer):
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "reasoning_content": "r",
         "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "ls"}}}]},
        {"role": "tool", "content": "x"},
    ]
    ids = tiny_tokenizer.encode(qwen3.render(messages, tools=[bash_tool]))
    for token in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>"):
        assert tiny_tokenizer.token_to_id(token) in ids, token
    assert ids.count(tiny_tokenizer.token_to_id("<|im_start|>")) == 5
    assert ids.count(tiny_tokenizer.token_to_id("<|im_end|>")) == 4
