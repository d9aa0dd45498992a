"""Shared fixtures for the chat-template tests."""

from __future__ import annotations

import pytest

from freetoken.chat.template import ChatTemplate

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
}

QWEN3_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}, '
    '"timeout": {"type": "integer"}}, "required": ["command"]}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


@pytest.fixture(scope="session")
def bash_tool() -> dict:
    return BASH_TOOL


@pytest.fixture(scope="session")
def qwen3_header() -> str:
    """The Qwen3 tool block of the system turn, after the system prompt (ends the system turn)."""
    return QWEN3_TOOLS_HEADER


@pytest.fixture(scope="session")
def qwen3() -> ChatTemplate:
    return ChatTemplate.for_model(None, "qwen3_moe")


@pytest.fixture(scope="session")
def qwen3_next() -> ChatTemplate:
    return ChatTemplate.for_model(None, "qwen3_next")


@pytest.fixture(scope="session")
def qwen3_5() -> ChatTemplate:
    return ChatTemplate.for_model(None, "qwen3_5_moe")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from freetoken.paths import ASSETS_DIR
    from freetoken.tokenizer.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(ASSETS_DIR / "tokenizer")
