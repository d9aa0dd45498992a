"""Edit boundaries, version gating and the anchor policy of each adapter."""

from __future__ import annotations

import pytest

from freetoken.prefix.anchors import AnchorKind, AnchorPolicy
from harness_adapters import EditBoundary, adapter_names, get_adapter
from harness_adapters.base import agent_version, parse_version

K = AnchorKind
BASE = {K.TURN_START, K.GENERATION_START, K.GENERATION_END}


def test_anchor_policy_of_each_harness() -> None:
    expected = {
        "claude_code": BASE,
        "opencode": BASE,  # P1 prune is opt-in
        "openclaw": BASE | {K.THINKING_START, K.TOOL_OUTPUT_START},  # E1, E8
        "swe_agent": BASE | {K.TOOL_OUTPUT_START},  # S1
        "mini_swe_agent": BASE,
        "codex": BASE,  # X1/X2/X4 land on turn starts; X3, X5, X6 never move served tokens
        "generic": BASE,
    }
    for name in adapter_names():
        policy = get_adapter(name).anchor_policy()
        assert isinstance(policy, AnchorPolicy)
        assert policy.kinds == frozenset(expected[name]), name


def test_boundary_codes_and_anchors() -> None:
    def table(name):
        return {b.code: (b.anchor, b.default_on) for b in get_adapter(name).boundaries}

    common = {"B0": (K.GENERATION_START, True), "B1": (K.TURN_START, True)}
    assert table("openclaw") == common | {
        "E1": (K.THINKING_START, True), "E2": (K.THINKING_START, False),
        "E3": (K.THINKING_START, False), "E4": (K.TOOL_OUTPUT_START, False),
        "E5": (K.TOOL_OUTPUT_START, False), "E6": (K.TOOL_OUTPUT_START, False),
        "E7": (K.TOOL_OUTPUT_START, False), "E8": (K.TOOL_OUTPUT_START, True),
        "E9": (K.TURN_START, True), "E10": (K.TURN_START, True)}
    assert table("opencode") == common | {
        "P1": (K.TOOL_OUTPUT_START, False), "P2": (K.TURN_START, True),
        "P3": (K.TURN_START, True), "P4": (K.TURN_START, True), "P5": (K.GENERATION_START, True)}
    assert table("swe_agent") == common | {
        "S1": (K.TOOL_OUTPUT_START, True), "S2": (K.TURN_START, False),
        "S3": (K.TURN_START, False), "S4": (K.TURN_START, True), "S5": (K.GENERATION_START, True)}
    assert table("mini_swe_agent") == common | {"M1": (K.GENERATION_START, True),
                                                "M2": (K.TURN_START, False)}
    assert table("claude_code") == common | {
        "C1": (K.TURN_START, True), "C2": (K.TURN_START, True), "C3": (K.THINKING_START, False),
        "C4": (K.TURN_START, True), "C5": (K.TOOL_OUTPUT_START, False),
        "C6": (K.TOOL_OUTPUT_START, False), "C7": (K.TOOL_OUTPUT_START, False),
        "C8": (K.TURN_START, True)}
    assert table("codex") == common | {
        "X1": (K.TURN_START, True), "X2": (K.TURN_START, True),
        "X3": (K.TOOL_OUTPUT_START, False), "X4": (K.TURN_START, True),
        "X5": (K.TURN_START, False), "X6": (K.TOOL_OUTPUT_START, False)}
    assert table("generic") == common


def test_claude_code_version_gates() -> None:
    cc = get_adapter("claude_code")

    def codes(version):
        return [b.code for b in cc.edit_boundaries(version)]

    assert codes((1, 0, 98)) == ["B0", "B1", "C2", "C3", "C5", "C6", "C7", "C8"]
    assert codes((2, 1, 35)) == codes((1, 0, 98))
    assert codes((2, 1, 36)) == ["B0", "B1", "C1", "C2", "C3", "C5", "C6", "C7", "C8"]
    assert codes((2, 1, 153)) == codes((2, 1, 36))
    assert codes((2, 1, 154)) == ["B0", "B1", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8"]
    assert codes((3,)) == codes((2, 1, 154)) == codes(None)
    assert cc.anchor_policy((1, 0, 98)).kinds == frozenset(BASE)


def test_edit_boundary_applies_and_checks() -> None:
    b = EditBoundary("X1", "x", K.TURN_START, True, since=(1, 2), until=(2,))
    assert [b.applies(v) for v in [None, (1, 1, 9), (1, 2), (1, 9, 9), (2,), (2, 0, 1)]] == \
        [True, False, True, True, False, False]
    with pytest.raises(ValueError, match=r"EditBoundary X1: since \(2,\) must be before until \(1,\)"):
        EditBoundary("X1", "x", K.TURN_START, True, since=(2,), until=(1,))
    with pytest.raises(TypeError, match="EditBoundary.anchor must be an AnchorKind"):
        EditBoundary("X1", "x", "turn_start", True)
    with pytest.raises(ValueError, match="EditBoundary.code must be a non-empty string"):
        EditBoundary("", "x", K.TURN_START, True)
    with pytest.raises(TypeError, match="version must be None or a non-empty tuple"):
        b.applies("2.1")
    with pytest.raises(TypeError, match="version must be None or a non-empty tuple"):
        get_adapter("openclaw").anchor_policy([2, 1])


def test_version_parsing() -> None:
    assert parse_version("2.1.197.123", parts=3) == (2, 1, 197)
    assert parse_version("v10") == (10,)
    assert parse_version("none") is None
    assert agent_version("claude-cli/2.1.197 (external, sdk-cli)", "claude-cli") == (2, 1, 197)
    assert agent_version("opencode/1.18.33 ai-sdk/provider-utils/4.0.23", "ai-sdk") is None
    assert agent_version("x myopencode/1.0", "opencode") is None
    with pytest.raises(TypeError, match="version text must be a string, got NoneType"):
        parse_version(None)
