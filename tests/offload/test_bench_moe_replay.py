"""Smoke test of evals.bench_moe_replay on two tiny synthetic conversations, and trace rendering."""

from __future__ import annotations

import json
import math

import numpy as np

from evals.bench_moe_replay import POLICIES, parse_args, run
from evals.trace_prompts import template_messages

OPENAI_CALL = {"turn": 0, "messages": [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "The test fails."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
], "response": None}
ANTHROPIC_MESSAGES = [
    {"role": "user", "content": [{"type": "text", "text": "Read a.py"}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "look"}, {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a.py"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "x=1"}]}]},
]


def test_anthropic_blocks_become_template_messages():
    assert template_messages(ANTHROPIC_MESSAGES) == [
        {"role": "user", "content": "Read a.py"},
        {"role": "assistant", "content": "ok", "reasoning_content": "look",
         "tool_calls": [{"id": "t1", "type": "function",
                         "function": {"name": "Read", "arguments": {"path": "a.py"}}}]},
        {"role": "tool", "content": "x=1", "tool_call_id": "t1"},
    ]


def test_run_records_and_replays(tmp_path, tiny_checkpoint):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "a.jsonl").write_text(json.dumps(OPENAI_CALL) + "\n")
    anthropic_call = {"turn": 0, "messages": ANTHROPIC_MESSAGES, "response": None}
    (traces / "b.jsonl").write_text(json.dumps(anthropic_call) + "\n")
    out = tmp_path / "trace.npz"
    args = parse_args(["--model", str(tiny_checkpoint("qwen3_next")), "--traces", str(traces),
                       "--conversations", "a.jsonl", "b.jsonl", "--max-prompt-tokens", "24",
                       "--decode-tokens", "4", "--fractions", "0.25", "0.5",
                       "--warmup-frac", "0", "--out", str(out)])
    results = run(args)

    with np.load(out) as z:
        ids, phase, seq = z["topk_ids"], z["token_phase"], z["seq_id"]
    assert ids.shape == (24 + 4 + 24 + 4, 4, 4)  # tiny qwen3_next: 4 MoE layers, top-4
    assert ids.min() >= 0 and ids.max() < 16
    np.testing.assert_array_equal(phase, [0] * 24 + [1] * 4 + [0] * 24 + [1] * 4)
    np.testing.assert_array_equal(seq, [0] * 28 + [1] * 28)
    assert [(r["fraction"], r["slots"]) for r in results] == [(0.25, 16), (0.5, 32)]
    for r in results:
        assert (r["scored_steps"], r["accesses"]) == (8, 8 * 4 * 4)
        assert r["random_weights"] and r["prefill_tokens"] == 48 and r["decode_tokens"] == 8
        miss = r["miss_rate"]
        assert set(miss) == set(POLICIES)
        assert math.isnan(miss["st-warm"])  # no warm-up slice to pick its set from
        assert all(0.0 <= miss[p] <= 1.0 for p in POLICIES if p != "st-warm")
        assert miss["MIN"] <= miss["LRU"] + 1e-9
    assert results[1]["miss_rate"]["MIN"] <= results[0]["miss_rate"]["MIN"]
