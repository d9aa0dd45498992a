"""Prefix reuse through the engine on the tiny hybrid (Gated DeltaNet + attention) model.

For each harness edit (a)-(f) of issue 4, a first request is served, then the edited one; the
reused prompt tokens (``cached_tokens``) must equal the start of the edited block (computed from
the rendered text, independently of the engine's anchor code), i.e. only the tokens after the
edit point are recomputed. With anchors off (tail-only checkpoints) the same edits reuse nothing.
Warm outputs must equal the outputs of a fresh engine.
"""

from __future__ import annotations

import pytest

from freetoken.core import GenerationRequest, SamplingParams
from freetoken.prefix.anchors import AnchorPolicy

from tests.prefix.engine_helpers import (
    agent_turns, call, expected_reuse, ids, make_engine, render, result, serve,
)

ARCH = "qwen3_next"
ALL = AnchorPolicy.all()
TAIL_ONLY = AnchorPolicy.parse("generation_end")


def _thinking_removed():
    first = agent_turns(2)
    second = first + [{"role": "assistant", "content": "Fixed the split."},
                      {"role": "user", "content": "Now add a test."}]
    return first, second  # the template drops earlier turns' reasoning after a new user query


def _tool_output_replaced():
    first = agent_turns(3)
    second = [dict(m) for m in first]
    second[3] = result("c0", "[Old tool result content cleared]")
    return first, second


def _observations_elided():
    first = agent_turns(4)
    second = [dict(m) for m in first]
    for i in (3, 5):  # all but the last two observations
        second[i] = result(second[i]["tool_call_id"], "Old environment output: (6 lines omitted)")
    return first, second


def _reply_rerendered():
    first = agent_turns(1)
    second = first + [{"role": "assistant", "content": "The split needed maxsplit=-1."},
                      {"role": "user", "content": "Thanks. Commit it."}]
    return first, second


def _identical():
    first = agent_turns(2)
    return first, [dict(m) for m in first]


def _suffix():
    first = agent_turns(1)
    return first, first + [call("c9", "pytest -q"), result("c9", "3 passed")]


def _sub_agents():
    first = agent_turns(0)
    second = [dict(m) for m in first]
    second[1] = {"role": "user", "content": "Sub-task: list every caller of parse()."}
    return first, second


EDITS = {
    "a_thinking_removed": _thinking_removed,
    "b_tool_output_replaced": _tool_output_replaced,
    "c_observations_elided": _observations_elided,
    "d_reply_rerendered": _reply_rerendered,
    "e_identical": _identical,
    "e_suffix": _suffix,
    "f_sub_agents": _sub_agents,
}


@pytest.mark.parametrize("arch", [ARCH, "qwen3_5_moe"])
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_edit_recomputes_only_the_tokens_after_the_edit_point(edit: str, arch: str) -> None:
    first, second = EDITS[edit]()
    text1, p1 = render(arch, first)
    text2, p2 = render(arch, second)
    want = expected_reuse(arch, text1, text2)
    assert 0 < want < len(p2)
    engine = make_engine(arch, anchors=ALL)
    serve(engine, p1, key=0)
    warm = serve(engine, p2, key=1)
    assert warm[-1].cached_tokens == want
    assert warm[-1].prompt_tokens - warm[-1].cached_tokens == len(p2) - want
    cold = serve(make_engine(arch, anchors=ALL), p2, key=0)
    assert cold[-1].cached_tokens == 0
    assert ids(warm) == ids(cold)


@pytest.mark.parametrize("edit", ["a_thinking_removed", "b_tool_output_replaced",
                                  "c_observations_elided", "f_sub_agents"])
def test_without_anchors_the_same_edits_recompute_the_whole_prompt(edit: str) -> None:
    first, second = EDITS[edit]()
    _, p1 = render(ARCH, first)
    _, p2 = render(ARCH, second)
    engine = make_engine(ARCH, anchors=TAIL_ONLY)
    serve(engine, p1, key=0)
    assert serve(engine, p2, key=1)[-1].cached_tokens == 0


def test_default_policy_falls_back_to_the_turn_start() -> None:
    first, second = _tool_output_replaced()
    text1, p1 = render(ARCH, first)
    _, p2 = render(ARCH, second)
    engine = make_engine(ARCH)  # turn starts + generation start/end
    serve(engine, p1, key=0)
    got = serve(engine, p2, key=1)[-1].cached_tokens
    block = text1.index("<tool_response>")
    turn = text1.rfind("<|im_start|>", 0, block)
    assert got == len(_encode(text1[:turn]))
    assert got < expected_reuse(ARCH, text1, render(ARCH, second)[0])


def test_next_turn_after_generation_reuses_prompt_and_reply() -> None:
    """Generation end: the next request that renders the sampled reply token-for-token reuses the
    whole earlier prompt and every generated token."""
    _, p1 = render(ARCH, agent_turns(1))
    engine = make_engine(ARCH)
    out = ids(serve(engine, p1, key=0, max_tokens=5))
    follow = p1 + tuple(out) + tuple(_encode("<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n"))
    warm = serve(engine, follow, key=1)
    assert warm[-1].cached_tokens == len(p1) + len(out)
    assert ids(warm) == ids(serve(make_engine(ARCH), follow, key=0))


def test_attention_only_model_reuses_the_longest_common_prefix() -> None:
    arch = "qwen3_moe"
    first, second = _tool_output_replaced()
    _, p1 = render(arch, first)
    _, p2 = render(arch, second)
    lcp = next(i for i, (a, b) in enumerate(zip(p1, p2)) if a != b)
    engine = make_engine(arch, anchors=TAIL_ONLY)
    serve(engine, p1, key=0)
    warm = serve(engine, p2, key=1)
    assert warm[-1].cached_tokens == lcp
    assert ids(warm) == ids(serve(make_engine(arch), p2, key=0))


def test_reuse_off_computes_everything() -> None:
    _, p1 = render(ARCH, agent_turns(1))
    engine = make_engine(ARCH, prefix_reuse=False)
    serve(engine, p1, key=0)
    assert serve(engine, p1, key=1)[-1].cached_tokens == 0
    assert engine.prefix.tree.num_tokens == 0


def _encode(text: str) -> list[int]:
    from tests.prefix.engine_helpers import tiny

    return list(tiny(ARCH)[2].encode(text))


def test_a_returning_request_refreshes_every_checkpoint_on_its_path() -> None:
    """Admission marks all checkpoints on the restored path as used (not only the one loaded),
    so a conversation that keeps coming back keeps its path; others keep their age."""
    first, second = _suffix()
    _, p1 = render(ARCH, first)
    _, p2 = render(ARCH, second)
    _, other = render(ARCH, _sub_agents()[1])
    engine = make_engine(ARCH, anchors=ALL)
    serve(engine, p1, key=0)
    serve(engine, other, key=1)
    store = engine.prefix.store
    before = {cid: store.last_use(cid) for cid in store.ids()}
    serve(engine, p2, key=2)
    path = set()
    node = engine.prefix.tree.match(p2[:-1]).node
    while node is not None:
        if node.checkpoint is not None and node.checkpoint in before:
            path.add(node.checkpoint)
        node = node.parent
    assert len(path) >= 3
    assert all(store.last_use(cid) > before[cid] for cid in path)
    off_path = [cid for cid in before if cid not in path and cid in store.ids()]
    assert off_path and all(store.last_use(cid) == before[cid] for cid in off_path)


def test_a_request_can_bring_its_own_anchor_policy() -> None:
    """The per-request policy (what a harness adapter will set per session) overrides the
    server's: all anchors on a tail-only server place the tool-output checkpoint, and a request
    asking for none gets no generation-end commit."""
    first, second = _tool_output_replaced()
    text1, p1 = render(ARCH, first)
    text2, p2 = render(ARCH, second)
    engine = make_engine(ARCH, anchors=TAIL_ONLY)
    serve(engine, p1, key=0, anchors=ALL)
    assert serve(engine, p2, key=1)[-1].cached_tokens == expected_reuse(ARCH, text1, text2)
    saves = engine.prefix.store.stats()["saves"]
    serve(engine, render(ARCH, _sub_agents()[1])[1], key=2, anchors=AnchorPolicy.none())
    assert engine.prefix.store.stats()["saves"] == saves  # no anchors, no generation end


def test_recorded_reply_reuses_up_to_the_generation_thinking_opener() -> None:
    """Default anchors: the next call renders the recorded reply (not the sampled one) right
    after the ``<|im_start|>assistant\\n`` header where the first prompt had ``<think>``; the
    checkpoint before that opener is restored, so only the reply and what follows recompute."""
    first = [{"role": "system", "content": "You are a coding agent."},
             {"role": "user", "content": "Fix the failing test in utils.py."}]
    second = first + [{"role": "assistant", "content": "I fixed the split."},
                      {"role": "user", "content": "Thanks. Commit it."}]
    _, p1 = render(ARCH, first)
    _, p2 = render(ARCH, second)
    lcp = next(i for i, (a, b) in enumerate(zip(p1, p2)) if a != b)
    # independent of the anchors: the prompts part at the generation prompt's opener
    assert p1[lcp] == _encode("<think>")[0] and p1[lcp:] == tuple(_encode("<think>\n"))
    engine = make_engine(ARCH)
    serve(engine, p1, key=0, max_tokens=3)
    warm = serve(engine, p2, key=1)
    assert warm[-1].cached_tokens == lcp
    assert ids(warm) == ids(serve(make_engine(ARCH), p2, key=0))


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_attention_only_gpt_oss_reuses_the_common_token_prefix(edit: str) -> None:
    """gpt-oss has no recurrent state: after any edit the radix tree reuses every token up to
    the first that differs (all but the last of an identical prompt), across its sliding-window
    layers too, and the tokens equal a cold run."""
    first, second = EDITS[edit]()
    _, p1 = render("gpt_oss", first)
    _, p2 = render("gpt_oss", second)
    common = next((i for i, (a, b) in enumerate(zip(p1, p2)) if a != b), min(len(p1), len(p2)))
    want = min(common, len(p2) - 1)
    engine = make_engine("gpt_oss", anchors=ALL)
    serve(engine, p1, key=0)
    warm = serve(engine, p2, key=1)
    assert warm[-1].cached_tokens == want
    cold = serve(make_engine("gpt_oss", anchors=ALL), p2, key=0)
    assert cold[-1].cached_tokens == 0
    assert ids(warm) == ids(cold)


def test_admission_chunk_reports_the_reuse_before_the_prefill() -> None:
    """``report_admission``: one empty chunk at admission, before any token, already carrying
    ``cached_tokens`` (the server's Anthropic ``message_start`` reports it); none without it."""
    _, p1 = render(ARCH, agent_turns(1))
    engine = make_engine(ARCH)
    cold = serve(engine, p1, key=0)
    assert all(c.token_ids for c in cold)  # not asked for: no admission chunk
    chunks: list = []
    req = GenerationRequest("r1", p1, SamplingParams(max_tokens=4, temperature=0.0,
                                                     ignore_eos=True), report_admission=True)
    engine.add_request(1, req, chunks.append)
    assert engine.step()
    first = chunks[0]
    assert (first.token_ids, first.text, first.finish_reason) == ((), "", None)
    assert (first.prompt_tokens, first.cached_tokens) == (len(p1), len(p1) - 1)
    while engine.step():
        pass
    assert [c.cached_tokens for c in chunks[1:]] == [len(p1) - 1] * (len(chunks) - 1)
    assert ids(chunks[1:]) == ids(cold) and all(c.token_ids for c in chunks[1:])
