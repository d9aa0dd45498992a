"""Each harness's edit simulator on small conversations: exact output, placeholders as
shared/research/harnesses.md quotes them, input never modified."""

from __future__ import annotations

import copy

import pytest

from harness_adapters import adapter_names, get_adapter


def call(cid: str, name: str = "exec", args: dict | None = None) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args or {}}}


def asst(reasoning: str | None = None, content: str = "", calls: list | None = None) -> dict:
    msg = {"role": "assistant", "content": content}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = calls
    return msg


def tool(cid: str, content: str) -> dict:
    return {"role": "tool", "content": content, "tool_call_id": cid}


def user(content: str) -> dict:
    return {"role": "user", "content": content}


SYSTEM = {"role": "system", "content": "You are an agent."}


# ---------------------------------------------------------------------------------- OpenClaw
def test_openclaw_e1_keeps_only_the_current_first_tool_step() -> None:
    msgs = [SYSTEM, user("hi"), asst("r0", "Hello."), user("time?"),
            asst("r1", calls=[call("c1")]), tool("c1", "23:13"),
            asst("r2", calls=[call("c2")]), tool("c2", "ok"),
            user("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nctx")]
    before = copy.deepcopy(msgs)
    out = get_adapter("openclaw").simulate_edits(msgs)
    assert msgs == before
    assert out == [SYSTEM, user("hi"), asst(None, "Hello."), user("time?"),
                   asst("r1", calls=[call("c1")]), tool("c1", "23:13"),
                   asst(None, calls=[call("c2")]), tool("c2", "ok"), msgs[8]]


def test_openclaw_e1_placeholder_and_no_exemption_without_a_tool_result() -> None:
    msgs = [user("q"), asst("thinking only"), user("again"), asst("r", calls=[call("c")])]
    out = get_adapter("openclaw").simulate_edits(msgs)
    assert out == [user("q"), asst(None, "[assistant reasoning omitted]"), user("again"),
                   asst(None, calls=[call("c")])]
    assert get_adapter("openclaw").simulate_edits(msgs, drop_reasoning=False) == msgs


def test_openclaw_e10_internal_context_moves_to_the_end() -> None:
    ctx_old = user("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nturn 1")
    ctx_new = user("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nturn 2")
    msgs = [SYSTEM, user("do it"), ctx_old, asst("r1", calls=[call("c1")]), tool("c1", "ok"), ctx_new]
    out = get_adapter("openclaw").simulate_edits(msgs)
    assert out == [SYSTEM, user("do it"), asst("r1", calls=[call("c1")]), tool("c1", "ok"), ctx_new]
    assert get_adapter("openclaw").simulate_edits(msgs, runtime_context=False) == msgs


def test_openclaw_e4_e5_pruning() -> None:
    big = "".join(chr(97 + i % 26) for i in range(5000))
    msgs = [SYSTEM, user("go"), asst(None, calls=[call("a")]), tool("a", "first result"),
            asst(None, calls=[call("b")]), tool("b", big),
            asst(None, calls=[call("c")]), tool("c", big),  # 3rd-from-last assistant: kept
            asst(None, calls=[call("d")]), tool("d", big), asst(None, "done")]
    out = get_adapter("openclaw").simulate_edits(msgs, soft_trim=True, hard_clear=1)
    trimmed = (big[:1500] + "\n...\n" + big[-1500:] + "\n\n[Tool result trimmed: kept first 1500 "
               "chars and last 1500 chars of 5000 chars.]")
    assert out == msgs[:3] + [tool("a", "[Old tool result content cleared]"), msgs[4],
                              tool("b", trimmed)] + msgs[6:]
    assert get_adapter("openclaw").simulate_edits(msgs, hard_clear=5)[5] == \
        tool("b", "[Old tool result content cleared]")
    assert get_adapter("openclaw").simulate_edits(msgs, soft_trim=True, keep_last_assistants=5) == msgs


def test_openclaw_e9_compaction_keeps_tool_pairs_together() -> None:
    msgs = [SYSTEM, user("task"), asst("r", calls=[call("a")]), tool("a", "x"),
            asst(None, calls=[call("b")]), tool("b", "y")]
    out = get_adapter("openclaw").simulate_edits(msgs, summary="Did a and b.", keep_recent=1,
                                                 drop_reasoning=False)
    summary = ("The conversation history before this point was compacted into the following "
               "summary:\n\n<summary>\nDid a and b.\n</summary>")
    assert out == [SYSTEM, user(summary), asst(None, calls=[call("b")]), tool("b", "y")]
    assert get_adapter("openclaw").simulate_edits(msgs, summary="S", keep_recent=0) == \
        [SYSTEM, user(summary.replace("Did a and b.", "S"))]


# ---------------------------------------------------------------------------------- OpenCode
def test_opencode_p2_compaction() -> None:
    msgs = [SYSTEM, user("one"), asst(None, calls=[call("a", "read")]), tool("a", "x"),
            asst(None, "read it"), user("two"), asst(None, "ok"), user("three"), asst(None, "fine")]
    oc = get_adapter("opencode")
    cont = ("Continue if you have next steps, or stop and ask for clarification if you are unsure "
            "how to proceed.")
    head = [SYSTEM, user("What did we do so far?"), asst(None, "## Goal\nread")]
    assert oc.simulate_edits(msgs, summary="## Goal\nread") == head + msgs[5:] + [user(cont)]
    assert oc.simulate_edits(msgs, summary="## Goal\nread", tail_turns=1,
                             continue_message=False) == head + msgs[7:]
    assert oc.simulate_edits(msgs, summary="## Goal\nread", tail_turns=0) == head + [user(cont)]
    assert oc.simulate_edits(msgs) == msgs  # compaction needs a summary; prune is opt-in


def test_opencode_p1_prune() -> None:
    msgs = [SYSTEM, user("u1"), asst(None, calls=[call("a", "bash")]), tool("a", "a" * 30),
            asst(None, calls=[call("s", "skill")]), tool("s", "s" * 90),
            asst(None, calls=[call("b", "read")]), tool("b", "b" * 30),
            user("u2"), asst(None, calls=[call("c", "bash")]), tool("c", "c" * 500),
            user("u3"), asst(None, calls=[call("d", "bash")]), tool("d", "d" * 500)]
    oc = get_adapter("opencode")
    # the last two user turns (c, d) are protected; b fills the 35-token window; a goes
    out = oc.simulate_edits(msgs, prune=True, prune_protect=35, prune_minimum=20, count_tokens=len)
    assert out == msgs[:3] + [tool("a", "[Old tool result content cleared]")] + msgs[4:]
    # not more than the minimum freed: nothing changes
    assert oc.simulate_edits(msgs, prune=True, prune_protect=35, prune_minimum=30,
                             count_tokens=len) == msgs
    # the walk stops at a result cleared before
    cleared = msgs[:3] + [tool("a", "[Old tool result content cleared]")] + msgs[4:7] + \
        [tool("b", "b" * 200)] + msgs[8:]
    assert oc.simulate_edits(cleared, prune=True, prune_protect=10, prune_minimum=20,
                             count_tokens=len) == cleared[:7] + \
        [tool("b", "[Old tool result content cleared]")] + cleared[8:]
    # default estimate: characters / 4 against the 40k / 20k defaults
    long = [user("u1"), asst(None, calls=[call("x", "bash")]), tool("x", "x" * 200_000),
            asst(None, calls=[call("y", "bash")]), tool("y", "y" * 100_000),
            user("u2"), user("u3")]
    assert oc.simulate_edits(long, prune=True) == long[:2] + \
        [tool("x", "[Old tool result content cleared]")] + long[3:]


def test_opencode_prune_stops_at_the_summary() -> None:
    msgs = [SYSTEM, user("one"), asst(None, calls=[call("a", "bash")]), tool("a", "a" * 100),
            user("What did we do so far?"), asst(None, "summary"),
            asst(None, calls=[call("b", "bash")]), tool("b", "b" * 100), user("u2"), user("u3")]
    out = get_adapter("opencode").simulate_edits(msgs, prune=True, prune_protect=10,
                                                 prune_minimum=5, count_tokens=len)
    assert out == msgs[:7] + [tool("b", "[Old tool result content cleared]")] + msgs[8:]


# ---------------------------------------------------------------------------------- SWE-agent
def _swe(observations: int) -> list[dict]:
    msgs = [SYSTEM, user("demo"), user("instance\ntemplate")]
    for k in range(observations):
        msgs += [asst(None, calls=[call(f"c{k}", "bash")]),
                 tool(f"c{k}", "\n".join(f"line {j}" for j in range(k + 1)))]
    return msgs


def test_swe_agent_s1_last_n_observations() -> None:
    msgs = _swe(6)  # instance template + 6 observations
    before = copy.deepcopy(msgs)
    out = get_adapter("swe_agent").simulate_edits(msgs, n=3)
    assert msgs == before
    elided = {4: "Old environment output: (1 lines omitted)",
              6: "Old environment output: (2 lines omitted)",
              8: "Old environment output: (3 lines omitted)"}
    assert out == [({**m, "content": elided[i]} if i in elided else m) for i, m in enumerate(msgs)]
    # default n=5: 7 observations -> only the first tool result goes
    assert [i for i, m in enumerate(get_adapter("swe_agent").simulate_edits(msgs))
            if m != msgs[i]] == [4]
    # polling 4: (7 // 4) * 4 - 3 = 1 -> nothing elided yet; 8 observations -> 5 elided
    assert get_adapter("swe_agent").simulate_edits(msgs, n=3, polling=4) == msgs
    eight = _swe(7)
    changed = [i for i, m in enumerate(get_adapter("swe_agent").simulate_edits(eight, n=3, polling=4))
               if m != eight[i]]
    assert changed == [4, 6, 8, 10]
    assert get_adapter("swe_agent").simulate_edits(msgs, n=None) == msgs


# ---------------------------------------------------------------------------------- Claude Code
def test_claude_code_c3_thinking_clear() -> None:
    msgs = [SYSTEM, user("q"), asst("t1", "a"), user("q2"), asst("t2", calls=[call("c", "Bash")]),
            tool("c", "out"), asst("t3", "b"), asst(None, "no thinking")]
    cc = get_adapter("claude_code")
    assert cc.simulate_edits(msgs, keep_thinking_turns=1) == \
        [SYSTEM, user("q"), asst(None, "a"), user("q2"), asst(None, calls=[call("c", "Bash")]),
         tool("c", "out"), asst("t3", "b"), asst(None, "no thinking")]
    assert all("reasoning_content" not in m for m in cc.simulate_edits(msgs, keep_thinking_turns=0))
    assert cc.simulate_edits(msgs) == msgs


def test_claude_code_c5_microcompact() -> None:
    msgs = [SYSTEM, user("q")]
    for k in range(7):
        msgs += [asst(None, calls=[call(f"b{k}", "Bash")]), tool(f"b{k}", f"out {k}")]
    msgs += [asst(None, calls=[call("t", "Task")]), tool("t", "sub-agent report")]
    out = get_adapter("claude_code").simulate_edits(msgs, clear_tool_results=True)
    cleared = {3: "[Old tool result content cleared]", 5: "[Old tool result content cleared]"}
    assert out == [({**m, "content": cleared[i]} if i in cleared else m) for i, m in enumerate(msgs)]
    assert get_adapter("claude_code").simulate_edits(msgs, clear_tool_results=True,
                                                     keep_tool_results=7) == msgs


def test_claude_code_c2_compaction() -> None:
    msgs = [SYSTEM, user("q"), {"role": "system", "content": "<total_tokens>1</total_tokens>"},
            asst("t", "a")]
    assert get_adapter("claude_code").simulate_edits(msgs, summary="Summary of the work.") == \
        [SYSTEM, user("Summary of the work.")]


# ---------------------------------------------------------------------------------- all
def test_append_only_harnesses() -> None:
    msgs = _swe(3)
    for name in ("mini_swe_agent", "generic"):
        out = get_adapter(name).simulate_edits(msgs)
        assert out == msgs and out is not msgs
        with pytest.raises(TypeError, match=f"{name} simulate_edits takes no options, got \\['n'\\]"):
            get_adapter(name).simulate_edits(msgs, n=5)


@pytest.mark.parametrize("name, options", [
    ("openclaw", {"soft_trim": True, "hard_clear": 2, "summary": "s", "keep_recent": 4}),
    ("opencode", {"summary": "s", "prune": True, "prune_protect": 1, "prune_minimum": 0}),
    ("swe_agent", {"n": 1}),
    ("claude_code", {"keep_thinking_turns": 0, "clear_tool_results": True, "keep_tool_results": 0}),
    ("mini_swe_agent", {}),
    ("codex", {"summary": "s", "user_tokens": 3}),
    ("generic", {}),
])
def test_input_is_never_modified(name: str, options: dict) -> None:
    msgs = [SYSTEM, user("q"), asst("r", calls=[call("a", "Bash")]), tool("a", "x" * 5000)] * 3
    msgs = copy.deepcopy(msgs)
    before = copy.deepcopy(msgs)
    get_adapter(name).simulate_edits(msgs, **options)
    assert msgs == before


def test_bad_input() -> None:
    for name in adapter_names():
        with pytest.raises(TypeError, match="messages must be a list, got dict"):
            get_adapter(name).simulate_edits({"role": "user"})
        with pytest.raises(TypeError, match=r"messages\[1\] must be a dict, got str"):
            get_adapter(name).simulate_edits([user("a"), "b"])
    with pytest.raises(ValueError, match="keep_last must be >= 1, got 0"):
        get_adapter("swe_agent").simulate_edits([], n=0)
    with pytest.raises(ValueError, match="summary must not be empty"):
        get_adapter("opencode").simulate_edits([], summary="")
    with pytest.raises(TypeError, match="unexpected keyword argument 'prune'"):
        get_adapter("claude_code").simulate_edits([], prune=True)
    with pytest.raises(ValueError, match="hard_clear must be >= 0, got -1"):
        get_adapter("openclaw").simulate_edits([], hard_clear=-1)
