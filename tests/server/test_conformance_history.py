"""Conformance: how conversation history is rendered (real qwen3_next template, live server).

* With thinking off, a turn sent back with empty reasoning / an empty thinking block re-renders
  exactly as it was generated, so turn N (prompt + output + end token) is a token prefix of
  turn N+1, whether a tool result or a new user turn follows (both APIs).
* System / developer messages inside the conversation render in place, in order (both APIs).
* glm4_moe (templates/glm4_moe.jinja): a GLM-form tool call comes back typed through both APIs,
  streamed or not, and sent back with its result it extends the prompt as generated.
"""

from __future__ import annotations

import json

import pytest

from tests.server.srv_conformance import (  # noqa: F401 (fixtures)
    RealServer,
    ant_tool,
    oai_tool,
    real,
    srv_real,
)

BASH = {"command": {"type": "string"}}
OFF = {"enable_thinking": False}
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


def _generated_prefix(server, script: str) -> tuple[int, ...]:
    """Prompt ids of the last request + the scripted output ids + the end-of-turn token."""
    out = tuple(server.engine.tokenizer.encode(script))
    return server.prompt_ids() + out + (server.engine.eos_id,)


def _assert_token_prefix(server, before: tuple[int, ...]) -> None:
    after = server.prompt_ids()
    assert len(after) > len(before)
    tok = server.engine.tokenizer
    assert after[: len(before)] == before, (tok.decode(before), tok.decode(after))


@pytest.mark.parametrize("follow_up", ["user", "tool"])
def test_openai_thinking_off_turn_is_a_token_prefix_of_the_next(srv_real, follow_up):
    tools = [oai_tool("bash", BASH)]
    script = "Let me look.\n" + CALL if follow_up == "tool" else "Hello there."
    first = [{"role": "user", "content": "list the files"}]
    r = srv_real.chat({"messages": first, "tools": tools, "chat_template_kwargs": OFF}, script)
    assert r.status == 200
    assert srv_real.prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    before = _generated_prefix(srv_real, script)

    echoed = {**r.message, "reasoning_content": ""}
    if follow_up == "tool":
        (call,) = r.message["tool_calls"]
        tail = [{"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}]
    else:
        tail = [{"role": "user", "content": "and the hidden ones?"}]
    history = first + [echoed] + tail
    r = srv_real.chat({"messages": history, "tools": tools, "chat_template_kwargs": OFF}, "ok")
    assert r.status == 200
    _assert_token_prefix(srv_real, before)


@pytest.mark.parametrize("follow_up", ["user", "tool"])
def test_anthropic_no_thinking_turn_is_a_token_prefix_of_the_next(srv_real, follow_up):
    tools = [ant_tool("bash", BASH)]
    script = "Let me look.\n" + CALL if follow_up == "tool" else "Hello there."
    first = [{"role": "user", "content": "list the files"}]
    r = srv_real.message({"messages": first, "tools": tools}, script)
    assert r.status == 200
    assert srv_real.prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    before = _generated_prefix(srv_real, script)

    empty_thinking = {"type": "thinking", "thinking": "", "signature": ""}
    echoed = {"role": "assistant", "content": [empty_thinking] + r.message["content"]}
    if follow_up == "tool":
        use = r.message["content"][-1]
        assert use["type"] == "tool_use"
        tail = [
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "a.txt"}],
            }
        ]
    else:
        tail = [{"role": "user", "content": "and the hidden ones?"}]
    r = srv_real.message({"messages": first + [echoed] + tail, "tools": tools}, "ok")
    assert r.status == 200
    _assert_token_prefix(srv_real, before)


@pytest.fixture(scope="module")
def qwen3_5():
    server = RealServer(model_type="qwen3_5_moe")
    yield server
    server.close()


@pytest.mark.parametrize("model", ["qwen3_next", "qwen3_5_moe"])
def test_thinking_off_keeps_every_earlier_turn_stable_over_three_user_turns(
    srv_real, qwen3_5, model
):
    """Each request's prompt + output is a prefix of the next one, turn after turn (OpenAI
    clients usually send no reasoning field back at all)."""
    server = srv_real if model == "qwen3_next" else qwen3_5
    history: list[dict] = []
    before: tuple[int, ...] = ()
    for i, answer in enumerate(["One.", "Two.", "Three."]):
        history.append({"role": "user", "content": f"question {i}"})
        r = server.chat({"messages": history, "chat_template_kwargs": OFF}, answer)
        assert r.status == 200 and r.message["content"] == answer
        if before:
            _assert_token_prefix(server, before)
        before = _generated_prefix(server, answer)
        history.append({"role": "assistant", "content": answer})


@pytest.fixture(scope="module")
def glm4_moe():
    server = RealServer(model_type="glm4_moe")
    yield server
    server.close()


GLM_BASH = {"command": {"type": "string"}, "timeout": {"type": "integer"}}
GLM_CALL = (
    "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls -la</arg_value>\n"
    "<arg_key>timeout</arg_key>\n<arg_value>5</arg_value>\n</tool_call>"
)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_glm4_moe_tool_call_both_apis_and_the_next_prompt_extends(glm4_moe, api, stream):
    """templates/glm4_moe.jinja + the GLM call form: the call comes back typed (thinking on for
    OpenAI, off for Anthropic without ``thinking``), and once sent back with its result the next
    prompt is prompt + output + the <|observation|> turn (GLM turns have no end token)."""
    glm4_moe.engine.reset()
    first = [{"role": "user", "content": "list the files"}]
    if api == "openai":
        script = "\n<think>The user wants files.</think>\nLet me look.\n" + GLM_CALL
        body = {"messages": first, "tools": [oai_tool("bash", GLM_BASH)], "stream": stream}
        r = glm4_moe.chat(body, script)
        assert (r.status, r.finish_reason) == (200, "tool_calls"), r.body
        assert (r.message["reasoning_content"], r.message["content"]) == (
            "The user wants files.", "Let me look.")
        ((name, args),) = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                           for c in r.message["tool_calls"]]
        tail, gen = "<|assistant|>", "<|assistant|>"
        history = first + [r.message] + [
            {"role": "tool", "tool_call_id": c["id"], "content": "a.txt"}
            for c in r.message["tool_calls"]]
    else:
        script = "\nLet me look.\n" + GLM_CALL
        body = {"messages": first, "tools": [ant_tool("bash", GLM_BASH)], "stream": stream}
        r = glm4_moe.message(body, script)
        assert (r.status, r.message["stop_reason"]) == (200, "tool_use"), r.body
        text, use = r.message["content"]
        assert text == {"type": "text", "text": "Let me look."}
        name, args = use["name"], use["input"]
        tail, gen = "/nothink<|assistant|>\n<think></think>", "<|assistant|>\n<think></think>"
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": "a.txt"}
        history = first + [{"role": "assistant", "content": r.message["content"]},
                           {"role": "user", "content": [result]}]
    assert (name, args) == ("bash", {"command": "ls -la", "timeout": 5})
    prompt = glm4_moe.prompt()
    assert prompt.startswith("[gMASK]<sop><|system|>\n# Tools\n")
    assert prompt.endswith("<|user|>\nlist the files" + tail)
    if api == "openai":
        r = glm4_moe.chat({"messages": history, "tools": body["tools"]}, "ok")
    else:
        r = glm4_moe.message({"messages": history, "tools": body["tools"]}, "ok")
    assert r.status == 200, r.body
    assert glm4_moe.prompt() == (
        prompt + script + "<|observation|>\n<tool_response>\na.txt\n</tool_response>" + gen
    )


def test_anthropic_system_messages_inside_messages_render_in_place(srv_real):
    body = {
        "system": [{"type": "text", "text": "Top system."}],
        "messages": [
            {"role": "system", "content": "First inline system."},
            {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"},
            {"role": "system", "content": "Mid system A."},
            {"role": "system", "content": [{"type": "text", "text": "Mid system B."}]},
            {"role": "user", "content": "u2"},
        ],
    }
    for stream in (False, True):
        r = srv_real.message({**body, "stream": stream}, "Fine.")
        assert r.status == 200, r.body
        assert r.message["content"] == [{"type": "text", "text": "Fine."}]
        assert srv_real.prompt() == (
            "<|im_start|>system\nTop system.<|im_end|>\n"
            "<|im_start|>system\nFirst inline system.<|im_end|>\n"
            "<|im_start|>user\nu1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\na1<|im_end|>\n"
            "<|im_start|>system\nMid system A.<|im_end|>\n"
            "<|im_start|>system\nMid system B.<|im_end|>\n"
            "<|im_start|>user\nu2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )


def test_anthropic_system_only_inside_messages_with_tools(srv_real):
    """No top-level system: the first inline system message opens the prompt (with the tool
    list); a later one stays where it was sent."""
    body = {
        "tools": [ant_tool("bash", BASH)],
        "messages": [
            {"role": "system", "content": "Inline first."},
            {"role": "user", "content": "u1"},
            {"role": "system", "content": "Inline later."},
        ],
    }
    r = srv_real.message(body, "Fine.")
    assert r.status == 200, r.body
    prompt = srv_real.prompt()
    assert prompt.startswith("<|im_start|>system\nInline first.\n\n# Tools\n")
    tool_json = json.dumps(
        {
            "type": "function",
            "function": {
                "name": "bash",
                "parameters": {"type": "object", "properties": BASH},
            },
        }
    )
    assert "<tools>\n" + tool_json + "\n</tools>" in prompt
    assert prompt.endswith(
        "<|im_start|>user\nu1<|im_end|>\n<|im_start|>system\nInline later.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_openai_system_and_developer_mid_conversation_render_in_place(srv_real):
    messages = [
        {"role": "developer", "content": "Dev first."},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "system", "content": "Sys mid."},
        {"role": "developer", "content": [{"type": "text", "text": "Dev mid."}]},
        {"role": "user", "content": "u2"},
    ]
    for stream in (False, True):
        r = srv_real.chat({"messages": messages, "stream": stream}, "x\n</think>\n\nFine.")
        assert r.status == 200, r.body
        assert (r.message["reasoning_content"], r.message["content"]) == ("x", "Fine.")
        assert srv_real.prompt() == (
            "<|im_start|>system\nDev first.<|im_end|>\n"
            "<|im_start|>user\nu1<|im_end|>\n"
            "<|im_start|>assistant\na1<|im_end|>\n"
            "<|im_start|>system\nSys mid.<|im_end|>\n"
            "<|im_start|>system\nDev mid.<|im_end|>\n"
            "<|im_start|>user\nu2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n"
        )
