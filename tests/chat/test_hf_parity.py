"""ChatTemplate renders FreeToken's templates exactly as transformers' apply_chat_template does."""

from __future__ import annotations

import pytest
import transformers

from freetoken.chat.template import ChatTemplate
from freetoken.paths import ASSETS_DIR, TEMPLATES_DIR

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Sys ü"},
        {"role": "user", "content": "Q"},
        {"role": "system", "content": "mid"},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "r",
         "tool_calls": [{"id": "1", "type": "function",
                         "function": {"name": "bash", "arguments": {"command": "ls <dir> & echo 'é'"}}},
                        {"id": "2", "type": "function", "function": {"name": "read", "arguments": {"n": [1, 2], "ok": True}}}]},
        {"role": "tool", "tool_call_id": "1", "content": "a"},
        {"role": "tool", "tool_call_id": "2", "content": "b"},
        {"role": "user", "content": "<tool_response>\nc\n</tool_response>"},
    ],
    [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\ninline\n</think>\n\nA1"},
        {"role": "user", "content": [{"type": "text", "text": "Q"}, {"type": "text", "text": "2"}]},
        {"role": "assistant", "content": "A2"},
    ],
]


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(ASSETS_DIR / "tokenizer" / "tokenizer.json"))


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_next", "qwen3_5_moe"])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("enable_thinking", [None, False])
@pytest.mark.parametrize("with_tools", [False, True])
def test_same_text_as_transformers(hf_tokenizer, bash_tool, model_type, conversation, enable_thinking, with_tools):
    source = (TEMPLATES_DIR / f"{model_type}.jinja").read_text(encoding="utf-8")
    messages = CONVERSATIONS[conversation]
    tools = [bash_tool] if with_tools else None
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    expected = hf_tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=source, tokenize=False, add_generation_prompt=True, **kwargs
    )
    ours = ChatTemplate(source, flatten_text_parts=False).render(messages, tools=tools, enable_thinking=enable_thinking)
    assert ours == expected
