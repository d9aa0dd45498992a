"""Values outside what each API allows are a 400 with the API's own exact error body (naming the
field and the allowed values), and the server stays healthy: reasoning effort levels, Anthropic's
required ``max_tokens``, its thinking budget floor (and ceiling: below ``max_tokens``) and
temperature range, the completions endpoint's ``logprobs`` / ``best_of`` limits and OpenAI
``logit_bias`` ids and values."""

from __future__ import annotations

import json

import pytest

from tests.server.test_errors import CHAT, MSGS, USER, ant, oai

CMPL, RESP = "/v1/completions", "/v1/responses"
OAI_LEVELS = "'none', 'minimal', 'low', 'medium', 'high', 'xhigh' or 'max'"
ANT = {"messages": USER, "max_tokens": 5}
BUDGET_ABOVE_MAX = (
    "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation "
    "at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    "#max-tokens-and-context-window-size"
)

CASES = [
    ("chat-effort", CHAT, {"messages": USER, "reasoning_effort": "extreme"},
     oai(f"reasoning_effort: Input should be {OAI_LEVELS}", "reasoning_effort")),
    ("responses-effort", RESP, {"input": "hi", "reasoning": {"effort": "Hard"}},
     oai(f"reasoning.effort: Input should be {OAI_LEVELS}", "reasoning.effort")),
    ("chat-kwargs-effort", CHAT,
     {"messages": USER, "chat_template_kwargs": {"reasoning_effort": "extreme"}},
     oai(f"chat_template_kwargs.reasoning_effort: Input should be {OAI_LEVELS}",
         "chat_template_kwargs.reasoning_effort")),
    ("chat-effort-case", CHAT, {"messages": USER, "reasoning_effort": "High"},
     oai(f"reasoning_effort: Input should be {OAI_LEVELS}", "reasoning_effort")),
    ("ant-effort", MSGS, {**ANT, "output_config": {"effort": "extreme"}},
     ant("output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'")),
    ("ant-effort-thinking-off", MSGS,
     {**ANT, "thinking": {"type": "disabled"}, "output_config": {"effort": 3}},
     ant("output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'")),
    ("ant-count-effort", "/v1/messages/count_tokens", {**ANT, "output_config": {"effort": "x"}},
     ant("output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'")),
    ("ant-no-max-tokens", MSGS, {"messages": USER}, ant("max_tokens: Field required")),
    ("ant-budget-low", MSGS, {**ANT, "thinking": {"type": "enabled", "budget_tokens": 1023}},
     ant("thinking.budget_tokens: Input should be greater than or equal to 1024")),
    ("ant-enabled-without-budget", MSGS, {**ANT, "thinking": {"type": "enabled"}},
     ant("thinking: budget_tokens is required when thinking is enabled")),
    ("ant-budget-equals-max-tokens", MSGS,
     {**ANT, "max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1024}},
     ant(BUDGET_ABOVE_MAX)),
    ("ant-budget-above-max-tokens", MSGS,
     {**ANT, "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 31999}},
     ant(BUDGET_ABOVE_MAX)),
    ("ant-temperature-high", MSGS, {**ANT, "temperature": 1.5},
     ant("temperature: Input should be less than or equal to 1")),
    ("ant-temperature-negative", MSGS, {**ANT, "temperature": -0.1},
     ant("temperature: Input should be greater than or equal to 0")),
    ("chat-logit-bias-boolean", CHAT, {"messages": USER, "logit_bias": {"5": True}},
     oai("logit_bias.5: Input should be a valid integer", "logit_bias.5")),
    ("chat-logit-bias-key", CHAT, {"messages": USER, "logit_bias": {"abc": 1}},
     oai("Invalid key in 'logit_bias': abc. You should only be submitting non-negative "
         "integers.", "logit_bias")),
    ("chat-logit-bias-vocab", CHAT, {"messages": USER, "logit_bias": {"8218": 1}},
     oai("Invalid key in 'logit_bias': 8218. Token ids must be below the vocabulary size "
         "8218.", "logit_bias")),
    ("chat-logit-bias-value", CHAT, {"messages": USER, "logit_bias": {"5": 100.5}},
     oai("Invalid value in 'logit_bias' for token 5: 100.5. Bias values must be between -100 "
         "and 100.", "logit_bias")),
    ("cmpl-logit-bias-value", CMPL, {"prompt": "x", "logit_bias": {"5": -101}},
     oai("Invalid value in 'logit_bias' for token 5: -101.0. Bias values must be between -100 "
         "and 100.", "logit_bias")),
    ("cmpl-logit-bias-negative-key", CMPL, {"prompt": "x", "logit_bias": {"-1": 1}},
     oai("Invalid key in 'logit_bias': -1. You should only be submitting non-negative "
         "integers.", "logit_bias")),
    ("cmpl-logprobs", CMPL, {"prompt": "x", "logprobs": 6},
     oai("logprobs: Input should be less than or equal to 5", "logprobs")),
    ("cmpl-best-of", CMPL, {"prompt": "x", "best_of": 2},
     oai("best_of: Input should be 1", "best_of")),
]


@pytest.mark.parametrize(("path", "body", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_out_of_range_value_is_a_400_with_exact_body(srv, path, body, expected):
    r = srv.http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (400, expected)
    assert srv.engine.logs == []  # nothing reached the engine
    srv.assert_healthy()


@pytest.mark.parametrize(("path", "body"), [
    (CHAT, {"messages": USER, "reasoning_effort": "xhigh"}),
    (RESP, {"input": "hi", "reasoning": {"effort": "minimal"}}),
    (MSGS, {**ANT, "output_config": {"effort": "max"}, "temperature": 1.0, "max_tokens": 1025,
            "thinking": {"type": "enabled", "budget_tokens": 1024}}),
    (CMPL, {"prompt": "x", "logprobs": 5, "best_of": 1}),
], ids=["chat", "responses", "messages", "completions"])
def test_values_at_the_limits_are_served(srv, path, body):
    assert srv.http.post(path, json=body).status_code == 200


def test_interleaved_thinking_budget_may_exceed_max_tokens(srv):
    # With the interleaved-thinking beta the budget spans the whole turn (Anthropic's docs), so
    # Claude Code's budget above a small max_tokens is served.
    body = {**ANT, "thinking": {"type": "enabled", "budget_tokens": 31999}}
    beta = {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}
    assert srv.http.post(MSGS, json=body, headers=beta).status_code == 200
    r = srv.http.post(MSGS, json=body, headers={"anthropic-beta": "claude-code-20250219"})
    assert (r.status_code, r.json()) == (400, ant(BUDGET_ABOVE_MAX))


@pytest.mark.parametrize(("path", "body"), [
    (CHAT, {"messages": USER}), (CMPL, {"prompt": "x"}),
], ids=["chat", "completions"])
def test_logit_bias_reaches_the_engine_sorted(srv, path, body):
    bias = {"8217": 100, "0": -100, "42": 2.5}
    assert srv.http.post(path, json={**body, "logit_bias": bias}).status_code == 200
    assert srv.engine.last.request.sampling.logit_bias == ((0, -100.0), (42, 2.5), (8217, 100.0))


@pytest.mark.parametrize("level", ["none", "minimal", "low", "medium", "high", "xhigh", "max"])
def test_every_openai_effort_level_is_served(srv, level):
    # exactly the levels of the OpenAI SDK's ReasoningEffort (generated from the API spec)
    r = srv.http.post(CHAT, json={"messages": USER, "reasoning_effort": level})
    assert r.status_code == 200
    r = srv.http.post(RESP, json={"input": "hi", "reasoning": {"effort": level}})
    assert r.status_code == 200
    kwargs = {"reasoning_effort": level.upper()}  # the template kwarg is case-insensitive
    r = srv.http.post(CHAT, json={"messages": USER, "chat_template_kwargs": kwargs})
    assert r.status_code == 200
