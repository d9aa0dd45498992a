"""Reasoning (<think>…</think>) splitting and the template's newline conventions."""

from __future__ import annotations

import pytest

from freetoken.parsers import ReasoningDelta as R
from freetoken.parsers import TextDelta as T
from freetoken.parsers import prompt_opens_reasoning


def test_prompt_opened_think_block(parse):
    assert parse("Let me think.\nMore.\n</think>\n\nThe answer is 4.", in_reasoning=True) == [
        R("Let me think.\nMore."),
        T("The answer is 4."),
    ]


def test_model_opened_think_block(parse):
    assert parse("<think>\nHmm.\n</think>\n\nHi!", in_reasoning=False) == [R("Hmm."), T("Hi!")]


def test_repeated_think_tag_after_prompt_opened_block_is_dropped(parse):
    assert parse("<think>\nx\n</think>\n\ny", in_reasoning=True) == [R("x"), T("y")]


def test_no_reasoning_at_all(parse):
    assert parse("Just text.\n\nTwo paragraphs.", in_reasoning=False) == [T("Just text.\n\nTwo paragraphs.")]


def test_empty_think_block(parse):
    assert parse("\n</think>\n\nAnswer", in_reasoning=True) == [T("Answer")]
    assert parse("<think>\n\n</think>\n\nAnswer", in_reasoning=False) == [T("Answer")]


def test_unterminated_reasoning_at_finish(parse):
    assert parse("thinking forever\n\n", in_reasoning=True) == [R("thinking forever")]


def test_inner_newlines_are_kept(parse):
    assert parse("\n\na\n\n\nb\n\n</think>\n\n\nc\n\nd\n", in_reasoning=True) == [R("a\n\n\nb"), T("c\n\nd\n")]


def test_stray_close_tag_in_answer_is_dropped(parse):
    assert parse("Answer </think>\nmore", in_reasoning=False) == [T("Answer more")]


def test_think_markup_inside_reasoning_other_than_close_is_reasoning(parse):
    assert parse("a <tool_call> b\n</think>\n\nc", in_reasoning=True) == [R("a <tool_call> b"), T("c")]


def test_reasoning_is_released_before_the_block_ends(run):
    parser_events = run("", chunks=["I am ", "thinking\n", "</thi", "nk>\n\nok"], in_reasoning=True)
    assert parser_events == [R("I am "), R("thinking"), T("ok")]


@pytest.mark.parametrize(
    "prompt, opened",
    [
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", False),
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n", True),
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
        ("<|im_start|>user\nsay <think><|im_end|>\n<|im_start|>assistant\n", False),
        ("", False),
    ],
)
def test_prompt_opens_reasoning(prompt, opened):
    assert prompt_opens_reasoning(prompt) is opened


def test_prompt_opens_reasoning_on_rendered_templates():
    from freetoken.chat.template import ChatTemplate

    conv = [{"role": "user", "content": "hi"}]
    cases = {("qwen3_moe", None): False, ("qwen3_moe", False): False, ("qwen3_next", None): True,
             ("qwen3_next", False): False, ("qwen3_5_moe", None): True, ("qwen3_5_moe", False): False}
    for (model_type, thinking), opened in cases.items():
        prompt = ChatTemplate.for_model(None, model_type).render(conv, enable_thinking=thinking)
        assert prompt_opens_reasoning(prompt) is opened, (model_type, thinking)
