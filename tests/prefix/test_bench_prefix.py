"""The prefix-reuse benchmark's core (evals/bench_prefix.py): minimum, replay through the engine
with the scripted stand-in, session interleaving and the harness edits.

Expected numbers are derived here from token ids and rendered text, independently of the engine.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from evals.bench_prefix import (
    POLICIES, Capacity, ReplayError, capacities, make_bench, make_case, minimum_recompute,
    qwen3_next_80b_layout, replay, replay_capacities,
)
from evals.prefix_traces import (
    GROUPS, Renderer, RenderedCall, Thread, TraceCall, Variant, group_traces, merge_session,
)
from freetoken.chat.template import ChatTemplate
from freetoken.models.tiny import cached_tiny
from freetoken.paths import shared_dir
from freetoken.tokenizer.tokenizer import Tokenizer
from harness_adapters.claude_code import strip_attribution_line
from harness_adapters.openclaw import strip_reasoning_openclaw
from harness_adapters.swe_agent import elide_old_observations

POLICY = {p.name: p for p in POLICIES}
BIG = Capacity("64", 64)


@lru_cache(maxsize=1)
def _tok() -> Tokenizer:
    return Tokenizer.from_pretrained(cached_tiny("qwen3_next"))


@lru_cache(maxsize=1)
def _renderer() -> Renderer:
    tok = _tok()
    return Renderer(tok, ChatTemplate.for_model(tok.chat_template, "qwen3_next"))


@lru_cache(maxsize=1)
def _bench():
    return make_bench("null", _tok(), chunk=512)


def _openai_loop(n: int, thread: str = "t") -> list[TraceCall]:
    """An append-only OpenAI tool loop: call k sends the history up to tool result k-1."""
    history = [{"role": "system", "content": "You are a coding agent."},
               {"role": "user", "content": "Count the lines of every file in src/."}]
    calls = []
    for k in range(n):
        reply = {"role": "assistant", "content": f"Looking at file {k}.", "tool_calls": [
            {"id": f"c{k}", "type": "function",
             "function": {"name": "bash", "arguments": f'{{"command": "wc -l src/f{k}.py"}}'}}]}
        calls.append(TraceCall(thread, k, "openai", list(history), None, reply))
        history += [reply, {"role": "tool", "tool_call_id": f"c{k}",
                            "content": f"{10 * k + 7} src/f{k}.py"}]
    return calls


def _anthropic_loop(n: int, thread: str = "a") -> list[TraceCall]:
    """The same loop in Anthropic blocks (rendered with thinking off, as /v1/messages does)."""
    history = [{"role": "system", "content": [{"type": "text", "text": "You are Claude Code."}]},
               {"role": "user", "content": [{"type": "text", "text": "List the TODOs."}]}]
    calls = []
    for k in range(n):
        reply = {"role": "assistant", "content": [
            {"type": "text", "text": f"Step {k}."},
            {"type": "tool_use", "id": f"toolu_{k}", "name": "Grep", "input": {"pattern": "TODO"}}]}
        calls.append(TraceCall(thread, k, "anthropic", list(history), None, reply))
        history += [reply, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": f"a.py:{k}: TODO"}]}]
    return calls


def _case(calls, variant=Variant()):
    return make_case("synthetic", [_renderer().render(c, variant) for c in calls])


def _recomputed(stats) -> list[int]:
    return [s.prompt - s.cached for s in stats]


# ------------------------------------------------------------------ minimum and capacities
def test_minimum_is_prompt_minus_longest_served_prefix_capped_at_prompt_minus_one() -> None:
    eos = 8194
    calls = [RenderedCall("t", (1, 2, 3, 4, 5), (6, 7, eos), True),
             RenderedCall("t", (1, 2, 3, 4, 5, 6, 7, eos, 9, 10), (11, eos), True),
             RenderedCall("t", (1, 2, 3, 4, 5, 6, 7, eos, 9, 10), (11, eos), True),
             RenderedCall("u", (1, 2, 99, 98), (eos,), True)]
    minimum, unique = minimum_recompute(calls)
    # 1: nothing served; 2: extends prompt 1 + reply 1 (8 ids); 3: identical to prompt 2 (cap:
    # the last id is recomputed); 4: shares (1, 2) only
    assert minimum == (5, 2, 1, 2)
    # KV sizing bound: each served sequence minus its prompt's longest served prefix
    assert unique == 8 + (12 - 8) + (12 - 10) + (5 - 2)


def test_default_capacity_is_the_host_budget_in_qwen3_next_80b_checkpoints() -> None:
    per_layer = 2 * 1024 * 1024 + 8192 * 3 * 2  # [32,128,128] fp32 + [8192,3] bf16
    assert qwen3_next_80b_layout().bytes_per_checkpoint() == 36 * per_layer == 77_266_944
    default = capacities()[-1]
    assert (default.device_slots, default.host_checkpoints) == (8, (16 << 30) // 77_266_944)
    # 16 GiB = 17,179,869,184 B; 222 checkpoints = 17,153,261,568 B, 26,607,616 B short of a 223rd
    assert default.host_checkpoints == 222


# ------------------------------------------------------------------ replay through the engine
def test_none_recomputes_every_prompt_token() -> None:
    case = _case(_openai_loop(4))
    stats, _ = replay(_bench(), case, POLICY["none"], BIG)
    assert _recomputed(stats) == [len(c.prompt_ids) for c in case.calls]


@pytest.mark.parametrize("loop", [_openai_loop, _anthropic_loop])
def test_anchors_reach_the_minimum_on_an_append_only_conversation(loop) -> None:
    case = _case(loop(4))
    stats, _ = replay(_bench(), case, POLICY["anchors"], BIG)
    assert _recomputed(stats) == list(case.minimum)
    assert case.minimum[0] == len(case.calls[0].prompt_ids)
    assert all(m < len(c.prompt_ids) for m, c in zip(case.minimum[1:], case.calls[1:]))


def test_generation_end_checkpoint_serves_the_next_call_when_the_reply_rerenders_exactly() -> None:
    case = _case(_anthropic_loop(3))
    assert all(c.aligned for c in case.calls)
    stats, _ = replay(_bench(), case, POLICY["tail-only"], BIG)
    for k in (1, 2):  # reused: the previous prompt and every generated token
        prev = case.calls[k - 1]
        assert stats[k].cached == len(prev.prompt_ids) + len(prev.reply_ids)
        assert case.calls[k].prompt_ids[:stats[k].cached] == prev.prompt_ids + prev.reply_ids


def test_tail_only_reuses_nothing_when_the_reply_merges_with_the_generation_prompt() -> None:
    """Thinking on, empty reasoning: the prompt ends ``<think>`` ``\\n`` and the history
    re-renders ``<think>`` ``\\n\\n`` ``</think>``, so every earlier generation end is off the
    path."""
    case = _case(_openai_loop(3))
    tok = _tok()
    assert not any(c.aligned for c in case.calls)
    assert case.calls[0].prompt_ids[-2:] == tuple(tok.encode("<think>\n"))
    stats, _ = replay(_bench(), case, POLICY["tail-only"], BIG)
    assert _recomputed(stats) == [len(c.prompt_ids) for c in case.calls]


def test_small_capacity_loses_a_returning_threads_checkpoint() -> None:
    """Two interleaved threads A1 B1 A2 B2 under tail-only: with one checkpoint slot B1's
    generation end evicts A1's, so A2 (and then B2) recompute their whole prompt; with four
    slots nothing is evicted and both returning calls reach the minimum."""
    a, b = _anthropic_loop(2, "a"), _anthropic_loop(2, "b")
    b = [TraceCall(c.thread, c.turn, c.protocol,
                   [c.messages[0], {"role": "user", "content": "Fix the build."}] + c.messages[2:],
                   None, c.response) for c in b]
    case = _case([a[0], b[0], a[1], b[1]])
    one, evictions = replay(_bench(), case, POLICY["tail-only"], Capacity("1", 1))
    four, none_evicted = replay(_bench(), case, POLICY["tail-only"], Capacity("4", 4))
    assert evictions > 0 and none_evicted == 0
    assert _recomputed(four)[2:] == list(case.minimum[2:])
    assert _recomputed(one)[2:] == [len(c.prompt_ids) for c in case.calls[2:]]
    assert all(case.minimum[i] < len(case.calls[i].prompt_ids) for i in (2, 3))
    runs = replay_capacities(_bench(), case, POLICY["tail-only"],
                             [Capacity("4", 4), Capacity("5", 5)])
    assert runs["5"] is runs["4"]  # no eviction at 4: the larger capacity is the same run


def test_an_output_off_the_script_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = make_bench("null", _tok(), chunk=512)
    real = bench.script.set
    monkeypatch.setattr(bench.script, "set", lambda p, r: real(p, (7,) + tuple(r[1:])))
    case = _case(_openai_loop(1))
    n = len(case.calls[0].reply_ids)
    with pytest.raises(ReplayError, match=f"emitted {n} tokens, {n - 1} matching the {n}-token"):
        replay(bench, case, POLICY["anchors"], BIG)


def test_stand_in_rejects_a_state_restored_at_the_wrong_depth() -> None:
    model = _bench().model
    state = model.new_paged_state(None, None, 5)  # script state still says 0 tokens
    with pytest.raises(RuntimeError, match="holds 0 tokens but the sequence state 5"):
        model.forward_batch([torch.tensor([1, 2])], [state])
    fresh = model.new_state()
    _bench().script.set((1, 2), (9, 8194))
    assert int(model.forward_batch([torch.tensor([1, 2])], [fresh])[0].argmax()) == 9
    assert int(model.forward_batch([torch.tensor([4])], [fresh])[0].argmax()) == 8194  # off script
    assert fresh.num_tokens == 3 and int(fresh.script_rec[1]) == 3


# ------------------------------------------------------------------ interleaving
def test_subagents_run_after_the_spawning_call_round_robin() -> None:
    def call(thread, turn, tool_ids=()):
        resp = {"role": "assistant", "content": [
            {"type": "tool_use", "id": i, "name": "Task", "input": {}} for i in tool_ids]}
        return TraceCall(thread, turn, "anthropic", [{"role": "user", "content": "x"}], None, resp)

    main = Thread("s__main", (call("m", 0), call("m", 1, ("t1", "t2")), call("m", 2)), {})
    sub1 = Thread("s__subagent01", (call("a", 0), call("a", 1), call("a", 2)),
                  {"parent_task_tool_use_id": "t1"})
    sub2 = Thread("s__subagent02", (call("b", 0),), {"parent_task_tool_use_id": "t2"})
    order = [(c.thread, c.turn) for c in merge_session("s", [main, sub1, sub2]).calls]
    assert order == [("m", 0), ("m", 1), ("a", 0), ("b", 0), ("a", 1), ("a", 2), ("m", 2)]


def test_captures_with_rows_merge_by_row() -> None:
    def call(thread, row):
        return TraceCall(thread, 0, "anthropic", [{"role": "user", "content": "x"}], None, None,
                         row)

    main = Thread("c__session1", (call("s1", 2), call("s1", 5)), {})
    aux = Thread("c__aux", (call("aux", 0), call("aux", 3), call("aux", 9)), {})
    late = Thread("c__session2", (call("s2", 7),), {})
    rows = [c.row for c in merge_session("c", [main, aux, late]).calls]
    assert rows == [0, 2, 3, 5, 7, 9]


# ------------------------------------------------------------------ harness edits
def test_swe_agent_elision_keeps_the_instance_and_the_last_observations() -> None:
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "demo"},
            {"role": "user", "content": "issue\ntext"}]
    for k in range(7):
        msgs += [{"role": "assistant", "content": f"a{k}"},
                 {"role": "user", "content": "\n".join(["line"] * (k + 1))}]
    out = elide_old_observations(msgs, keep_last=5)
    # 8 observations (instance + 7): the 2nd and 3rd are elided, the last 5 and the first kept
    assert [m["content"] for m in out][:4] == ["s", "demo", "issue\ntext", "a0"]
    # N counts lines, as SWE-agent's len(text.splitlines()) does
    assert out[4]["content"] == "Old environment output: (1 lines omitted)"
    assert out[6]["content"] == "Old environment output: (2 lines omitted)"
    assert out[8:] == msgs[8:] and msgs[4]["content"] == "line"


def test_openclaw_keeps_reasoning_only_on_the_first_tool_step_after_the_user() -> None:
    def asst(name, calls=False):
        m = {"role": "assistant", "content": "", "reasoning_content": name}
        if calls:
            m["tool_calls"] = [{"id": name, "type": "function",
                                "function": {"name": "exec", "arguments": {}}}]
        return m

    msgs = [{"role": "user", "content": "hi"}, asst("r0"),
            {"role": "user", "content": "time?"}, asst("r1", True),
            {"role": "tool", "tool_call_id": "r1", "content": "23:13"}, asst("r2", True),
            {"role": "tool", "tool_call_id": "r2", "content": "ok"}]
    out = strip_reasoning_openclaw(msgs)
    assert [m.get("reasoning_content") for m in out if m["role"] == "assistant"] == \
        [None, "r1", None]
    assert out[1]["content"] == "[assistant reasoning omitted]"
    assert msgs[1]["reasoning_content"] == "r0"


def test_attribution_line_is_removed_from_string_and_blocks() -> None:
    line = "x-anthropic-billing-header: cc_version=2.1.40.a1b; cc_entrypoint=cli; cch=3f2c1;"
    assert strip_attribution_line(f"{line}\nYou are Claude Code.") == "You are Claude Code."
    blocks = [{"type": "text", "text": line}, {"type": "text", "text": "You are Claude Code."}]
    assert strip_attribution_line(blocks) == blocks[1:]
    assert strip_attribution_line(None) is None


# ------------------------------------------------------------------ a real trace
def test_one_real_trace_or_a_synthetic_stand_in() -> None:
    """W4 OpenClaw Anthropic capture from ../shared when present (4 calls, ~16k-token prompts),
    else a synthetic Anthropic loop."""
    traces = shared_dir() / "traces"
    group = next(g for g in GROUPS if g.key == "w4-openclaw-recorded")
    if (traces / group.folders[0] / "openclaw_anthropic.jsonl").is_file():
        trace = next(t for t in group_traces(group, traces) if t.name == "openclaw_anthropic")
        calls = trace.calls
    else:
        calls = _anthropic_loop(4)
    case = _case(calls)
    none, _ = replay(_bench(), case, POLICY["none"], BIG)
    assert _recomputed(none) == [len(c.prompt_ids) for c in case.calls]
    anchors = replay_capacities(_bench(), case, POLICY["anchors"], capacities())["default"]
    assert sum(_recomputed(anchors)) <= 1.05 * sum(case.minimum)
    assert all(r >= m for r, m in zip(_recomputed(anchors), case.minimum))
    assert case.minimum[0] == len(case.calls[0].prompt_ids)
