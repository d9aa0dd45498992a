"""Anchor placement on real Qwen3-Next renders and the anchor policy parser."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from freetoken.chat.template import ChatTemplate
from freetoken.models.tiny import cached_tiny
from freetoken.prefix.anchors import Anchor, AnchorKind, AnchorMarkers, AnchorPolicy, find_anchors
from freetoken.tokenizer.tokenizer import Tokenizer

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]},
    },
}
# A tool loop after the last user query, so the template keeps both think blocks.
CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": "", "reasoning_content": "I should run ls.",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
    {"role": "assistant", "content": "Let me count lines.", "reasoning_content": "Now wc.",
     "tool_calls": [{"id": "c2", "type": "function",
                     "function": {"name": "bash", "arguments": {"command": "wc -l a.py"}}}]},
    {"role": "tool", "tool_call_id": "c2", "content": "3 a.py"},
]
MARKER_TEXT = {
    AnchorKind.TURN_START: "<|im_start|>",
    AnchorKind.THINKING_START: "<think>",
    AnchorKind.TOOL_CALL_START: "<tool_call>",
    AnchorKind.TOOL_OUTPUT_START: "<tool_response>",
}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_pretrained(cached_tiny("qwen3_next"))


@pytest.fixture(scope="module")
def rendered(tok: Tokenizer) -> tuple[str, list[int]]:
    text = ChatTemplate.for_model(tok.chat_template, "qwen3_next").render(CONVERSATION, tools=[BASH])
    return text, tok.encode(text)


def marker_positions_from_text(tok: Tokenizer, text: str) -> dict[int, AnchorKind]:
    """Token index of every marker string in the text, via the tokenizer's character offsets."""
    enc = tok.hf.encode(text, add_special_tokens=False)
    index_of_span = {span: i for i, span in enumerate(enc.offsets)}
    found = {}
    for kind, marker in MARKER_TEXT.items():
        for m in re.finditer(re.escape(marker), text):
            found[index_of_span[(m.start(), m.end())]] = kind
    return found


def test_markers_of_the_tiny_qwen3_next_tokenizer(tok):
    markers = AnchorMarkers.from_tokenizer(tok)
    assert markers == AnchorMarkers(
        turn_start=frozenset({tok.token_to_id("<|im_start|>")}),
        thinking_start=frozenset({tok.token_to_id("<think>")}),
        tool_call_start=frozenset({tok.token_to_id("<tool_call>")}),
        tool_output_start=frozenset({tok.token_to_id("<tool_response>")}),
    )
    assert AnchorMarkers.from_tokenizer(tok.hf) == markers  # a bare tokenizers.Tokenizer works too
    assert len(set().union(*(markers.ids_of(k) for k in MARKER_TEXT))) == 4


def test_anchors_of_a_rendered_tool_loop_match_the_marker_tokens(tok, rendered):
    text, ids = rendered
    anchors = find_anchors(ids, AnchorMarkers.from_tokenizer(tok), AnchorPolicy.all())
    from_text = marker_positions_from_text(tok, text)
    assert ids[0] == tok.token_to_id("<|im_start|>") and 0 in from_text  # position 0 is never an anchor
    expected = [Anchor(p, k) for p, k in sorted(from_text.items()) if p > 0]
    expected.append(Anchor(len(ids), AnchorKind.GENERATION_START))
    assert list(anchors) == expected
    # Independently from the ids: every occurrence of each marker id.
    for kind, marker in MARKER_TEXT.items():
        mid = tok.token_to_id(marker)
        by_id = [i for i, t in enumerate(ids) if t == mid and i > 0]
        assert [a.position for a in anchors if a.kind == kind] == by_id
    counts = {k: sum(a.kind == k for a in anchors) for k in AnchorKind}
    # 7 turns (first at 0); think: 2 kept blocks + the generation prompt; tool_call: 2 in the
    # system prompt's format instructions ("<tool_call></tool_call> XML tags:\n<tool_call>") + 2
    # calls; 2 tool outputs.
    assert counts == {AnchorKind.TURN_START: 6, AnchorKind.THINKING_START: 3, AnchorKind.TOOL_CALL_START: 4,
                      AnchorKind.TOOL_OUTPUT_START: 2, AnchorKind.GENERATION_START: 1,
                      AnchorKind.GENERATION_END: 0}
    # The state before each marker: the token at the anchor is the marker itself.
    for a in anchors[:-1]:
        assert tok.decode([ids[a.position]]) == MARKER_TEXT[a.kind]


def test_default_policy_keeps_turn_starts_and_generation_start(tok, rendered):
    _, ids = rendered
    anchors = find_anchors(ids, AnchorMarkers.from_tokenizer(tok), AnchorPolicy.default())
    im_start = tok.token_to_id("<|im_start|>")
    turns = [i for i, t in enumerate(ids) if t == im_start and i > 0]
    assert anchors == tuple(Anchor(p, AnchorKind.TURN_START) for p in turns) + (
        Anchor(len(ids), AnchorKind.GENERATION_START),)
    assert find_anchors(ids, AnchorMarkers.from_tokenizer(tok), AnchorPolicy.none()) == ()


def test_find_anchors_edge_cases():
    markers = AnchorMarkers(turn_start=frozenset({1}), thinking_start=frozenset({2}),
                            tool_call_start=frozenset({2, 3}))
    policy = AnchorPolicy.all()
    # Position 0 excluded, a marker at the last index kept, generation start at len.
    assert find_anchors([1, 5, 1, 3], markers, policy) == (
        Anchor(2, AnchorKind.TURN_START), Anchor(3, AnchorKind.TOOL_CALL_START),
        Anchor(4, AnchorKind.GENERATION_START))
    # Id 2 is a thinking and a tool-call marker: one anchor, the earlier kind.
    assert find_anchors([7, 2], markers, policy) == (Anchor(1, AnchorKind.THINKING_START),
                                                     Anchor(2, AnchorKind.GENERATION_START))
    only_calls = AnchorPolicy(frozenset({AnchorKind.TOOL_CALL_START}))
    assert find_anchors([7, 2, 1], markers, only_calls) == (Anchor(1, AnchorKind.TOOL_CALL_START),)
    assert find_anchors([], markers, policy) == ()
    assert find_anchors([1, 2, 3], AnchorMarkers.empty(), policy) == (Anchor(3, AnchorKind.GENERATION_START),)
    assert find_anchors(np.array([9, 1], dtype=np.int32), markers, policy) == find_anchors(
        torch.tensor([9, 1]), markers, policy) == (Anchor(1, AnchorKind.TURN_START),
                                                   Anchor(2, AnchorKind.GENERATION_START))
    with pytest.raises(ValueError, match=r"^prompt_ids must be a 1-D sequence of token ids, "
                                         r"got shape \(1, 2\) dtype int64$"):
        find_anchors([[1, 2]], markers, policy)
    with pytest.raises(ValueError, match="got shape \\(2,\\) dtype float64"):
        find_anchors([1.0, 2.0], markers, policy)


def test_absent_marker_tokens_are_left_out():
    hf = HFTokenizer(WordLevel({"<|im_start|>": 0, "<tool_call>": 5, "x": 1}, unk_token="x"))
    assert AnchorMarkers.from_tokenizer(hf) == AnchorMarkers(turn_start=frozenset({0}),
                                                             tool_call_start=frozenset({5}))
    with pytest.raises(TypeError, match="from_tokenizer needs a tokenizer with token_to_id, got int"):
        AnchorMarkers.from_tokenizer(3)
    with pytest.raises(TypeError, match="AnchorMarkers.turn_start must be a frozenset of token ids"):
        AnchorMarkers(turn_start={1})


def test_policy_parse():
    assert AnchorPolicy.parse("turn_start,generation_start").kinds == {AnchorKind.TURN_START,
                                                                       AnchorKind.GENERATION_START}
    assert AnchorPolicy.parse(" Thinking_Start , tool_output_start ").kinds == {
        AnchorKind.THINKING_START, AnchorKind.TOOL_OUTPUT_START}
    assert AnchorPolicy.parse("default") == AnchorPolicy.default()
    assert AnchorPolicy.default().kinds == {AnchorKind.TURN_START, AnchorKind.GENERATION_START,
                                            AnchorKind.GENERATION_END}
    assert AnchorPolicy.parse("all").kinds == frozenset(AnchorKind)
    assert AnchorPolicy.parse("none") == AnchorPolicy.parse("") == AnchorPolicy.none()
    assert str(AnchorPolicy.parse("generation_end,turn_start")) == "turn_start,generation_end"
    assert AnchorPolicy.parse(str(AnchorPolicy.all())) == AnchorPolicy.all()
    valid = ("valid kinds: turn_start, thinking_start, tool_call_start, tool_output_start, "
             "generation_start, generation_end (or one of all, default, none)")
    with pytest.raises(ValueError) as err:
        AnchorPolicy.parse("turn_start,tools")
    assert str(err.value) == f"unknown anchor kind 'tools' in 'turn_start,tools'; {valid}"
    with pytest.raises(ValueError) as err:
        AnchorPolicy.parse("turn_start,")
    assert str(err.value) == f"unknown anchor kind '' in 'turn_start,'; {valid}"
    with pytest.raises(TypeError, match="anchor policy must be a string, got list"):
        AnchorPolicy.parse(["turn_start"])
    with pytest.raises(TypeError, match="AnchorPolicy.kinds must be a frozenset of AnchorKind"):
        AnchorPolicy(frozenset({"turn_start"}))
