"""Request fixtures shaped like the real clients' (shared/research/real-clients.md §3-§6), written
for these tests: headers as the clients send them, bodies cut down to the parts detection reads."""

from __future__ import annotations

import json

from harness_adapters import RequestInfo

BILLING_LINE = "x-anthropic-billing-header: cc_version=2.1.197.f3a; cc_entrypoint=sdk-cli;"
CC_SESSION = "8d0c6a5e-2f4b-4c1e-9a7d-5b3e1f0c2d4a"
CC_BETA = ("claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
           "mid-conversation-system-2026-04-07,effort-2025-11-24")
OPENCODE_UA = "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14"
INTERNAL_CONTEXT = ("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nworkspace notes for this turn\n"
                    "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")
STAINLESS = {"x-stainless-lang": "python", "x-stainless-package-version": "3.57.0"}


def _fn(name: str, props: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} tool",
            "parameters": {"type": "object", "properties": props, "required": list(props)}}}


def claude_code(version: str = "2.1.197", *, billing: bool = True, headers: bool = True) -> RequestInfo:
    """``claude -p`` main-loop request: 3 system blocks (the attribution line first), a user
    turn and the mid-conversation system message, CLI headers."""
    system = [{"type": "text", "text": "You are Claude Code, a CLI for coding.",
               "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Environment: linux; cwd /work"}]
    if billing:
        system.insert(0, {"type": "text", "text": BILLING_LINE.replace("2.1.197", version)})
    body = {"model": "test-model", "max_tokens": 32000, "stream": True, "system": system,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "say hi"}]},
                         {"role": "system", "content": "Available agent types: general-purpose"}],
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}},
                      {"name": "Read", "input_schema": {"type": "object"}}],
            "metadata": {"user_id": json.dumps({"device_id": "d1", "account_uuid": "",
                                                "session_id": CC_SESSION})},
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}
    head = {"anthropic-version": "2023-06-01", "X-Api-Key": "dummy"}
    if headers:
        head |= {"anthropic-beta": CC_BETA, "x-app": "cli",
                 "User-Agent": f"claude-cli/{version} (external, sdk-cli)",
                 "X-Claude-Code-Session-Id": CC_SESSION, **STAINLESS}
    return RequestInfo("anthropic", "/v1/messages", head, body)


def opencode(*, user_agent: bool = True) -> RequestInfo:
    """OpenCode main request through ``@ai-sdk/openai-compatible``."""
    names = ("bash", "edit", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch", "write")
    body = {"model": "test-model", "max_tokens": 32000, "stream": True,
            "stream_options": {"include_usage": True}, "tool_choice": "auto",
            "messages": [{"role": "system", "content": "You are opencode. Today's date: Mon Nov 30 2026"},
                         {"role": "user", "content": "say hi"}],
            "tools": [_fn(n, {"x": {"type": "string"}}) for n in names]}
    head = {"Authorization": "Bearer dummy", "x-session-affinity": "ses_42",
            "x-session-id": "ses_42"}
    if user_agent:
        head["User-Agent"] = OPENCODE_UA
    return RequestInfo("openai", "/v1/chat/completions", head, body)


def openclaw_openai() -> RequestInfo:
    """OpenClaw on ``openai-completions``: two consecutive user messages, the second the
    internal-context block; OpenAI/JS SDK headers."""
    names = ("apply_patch", "edit", "exec", "ls", "process", "read", "sessions_yield",
             "tool_call", "tool_describe", "tool_search", "write")
    body = {"model": "test-model", "stream": True, "max_completion_tokens": 8192,
            "messages": [{"role": "system", "content": "You are a personal assistant running "
                          "inside OpenClaw.\n## Tooling"},
                         {"role": "user", "content": "[Mon 2026-11-30 01:10 UTC] say hi\n\n"
                          "Runtime: agent=main | session=agent:main:7f3a | model=local/test-model"},
                         {"role": "user", "content": INTERNAL_CONTEXT}],
            "tools": [_fn(n, {"x": {"type": "string"}}) for n in names], "tool_choice": "auto"}
    head = {"User-Agent": "OpenAI/JS 7.15.0", "traceparent": "00-ab-cd-01",
            "Authorization": "Bearer dummy"}
    return RequestInfo("openai", "/v1/chat/completions", head, body)


def openclaw_anthropic() -> RequestInfo:
    """OpenClaw on ``anthropic-messages``: undici User-Agent, consecutive user turns in blocks."""
    body = {"model": "test-model", "max_tokens": 8192, "stream": True,
            "system": [{"type": "text", "text": "You are a personal assistant."},
                       {"type": "text", "text": "Workspace files"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "say hi"}]},
                         {"role": "user", "content": [{"type": "text", "text": INTERNAL_CONTEXT}]}],
            "tools": [{"name": "exec", "input_schema": {"type": "object"}}]}
    head = {"User-Agent": "undici", "x-api-key": "dummy", "anthropic-version": "2023-06-01",
            "anthropic-dangerous-direct-browser-access": "true"}
    return RequestInfo("anthropic", "/v1/messages", head, body)


MINI_INSTANCE = ("Please solve this issue: division by zero.\n\n## Important Rules\n"
                 "To finish, issue the following command: `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.")
MINI_BASH = _fn("bash", {"command": {"type": "string"}})


def mini_swe_agent(*, instructions: bool = True) -> RequestInfo:
    """mini-swe-agent 2.x through litellm: non-streaming, only model/messages/tools, one bash
    tool, openai SDK headers."""
    body = {"model": "test-tool",
            "messages": [{"role": "system", "content": "You are a helpful assistant that can "
                          "interact with a computer."},
                         {"role": "user", "content": MINI_INSTANCE if instructions else "Fix it."}],
            "tools": [MINI_BASH]}
    head = {"User-Agent": "OpenAI/Python 3.57.0", **STAINLESS, "Authorization": "Bearer dummy"}
    return RequestInfo("openai", "/v1/chat/completions", head, body)


def swe_agent() -> RequestInfo:
    """SWE-agent through litellm with its ``extra_headers`` User-Agent."""
    body = {"model": "qwen", "temperature": 0.0, "top_p": 1.0,
            "messages": [{"role": "system", "content": "You are a helpful assistant that can "
                          "interact with a computer to solve tasks."},
                         {"role": "user", "content": "<uploaded_files>/testbed</uploaded_files>"}],
            "tools": [_fn("bash", {"command": {"type": "string"}}),
                      _fn("str_replace_editor", {"command": {"type": "string"}}),
                      _fn("submit", {})]}
    head = {"User-Agent": "swe-agent/1.1.0", **STAINLESS}
    return RequestInfo("openai", "/v1/chat/completions", head, body)


def litellm_anthropic() -> RequestInfo:
    """``litellm.completion(model="anthropic/test-model", api_base=...)`` on its own."""
    body = {"model": "test-model", "max_tokens": 4096, "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}]}
    head = {"User-Agent": "litellm/1.110.2", "anthropic-version": "2023-06-01", "x-api-key": "d"}
    return RequestInfo("anthropic", "/v1/messages", head, body)


def openai_sdk() -> RequestInfo:
    """A plain ``openai`` SDK chat call."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    return RequestInfo("openai", "/v1/chat/completions",
                       {"User-Agent": "OpenAI/Python 3.57.0", **STAINLESS}, body)


CODEX_THREAD = "01a2340b-92a4-77f3-8c5e-2af67ca32069"
CODEX_BASE_PROMPT = ("You are a coding agent running in the Codex CLI, a terminal-based coding "
                     "assistant.")


def _responses_fn(name: str) -> dict:
    return {"type": "function", "name": name, "description": f"{name} tool", "strict": False,
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}


def codex(*, headers: bool = True, base_prompt: bool = True) -> RequestInfo:
    """``codex exec`` 0.171.0 through a custom Responses provider: developer messages, the
    environment-context user message, the prompt; headers as Codex sent them (cut down)."""
    developer = CODEX_BASE_PROMPT if base_prompt else "Follow the rules."
    body = {"model": "test-model", "stream": True, "store": False, "tool_choice": "auto",
            "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": CODEX_THREAD,
            "input": [{"type": "message", "role": "developer",
                       "content": [{"type": "input_text", "text": developer}]},
                      {"type": "message", "role": "user", "content": [
                          {"type": "input_text",
                           "text": "<environment_context>\n  <cwd>/w</cwd>"}]},
                      {"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "Say hi."}]}],
            "tools": [_responses_fn("exec_command"), _responses_fn("write_stdin"),
                      {"type": "web_search", "external_web_access": False}]}
    head = {"content-type": "application/json", "authorization": "Bearer dummy"}
    if headers:
        head |= {"originator": "codex_exec", "session-id": CODEX_THREAD, "thread-id": CODEX_THREAD,
                 "x-codex-window-id": f"{CODEX_THREAD}:0",
                 "x-codex-turn-metadata": '{"turn_trigger":"exec","request_kind":"turn"}',
                 "User-Agent": "codex_exec/0.171.0 (Debian 12.0.0; x86_64) unknown "
                               "(codex_exec; 0.171.0)"}
    return RequestInfo("openai", "/v1/responses", head, body)
