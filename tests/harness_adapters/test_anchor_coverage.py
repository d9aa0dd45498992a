"""The property the anchor policies exist for: after a harness edit, the first token where the
next prompt differs from what the server has already processed (the previous prompt plus its
generation) is covered by a checkpoint of the adapter's policy.

One agent step is replayed with the project's chat templates and the tiny tokenizer: the
previous request is ``simulate_edits(H)`` rendered with the generation prompt, the server also
holds the reply as rendered from the generated message, and the next request is
``simulate_edits(H + [reply] + results)``. "Covered" means the nearest checkpoint at or before
the first differing token (anchors of ``find_anchors`` on the previous prompt, plus the
generation end) is separated from it only by the opening of its own block (``<think>\\n``,
``<tool_response>\\n``, ``<|im_start|>user\\n``), so only that opening is recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import pytest

from freetoken.chat.template import ChatTemplate
from freetoken.paths import ASSETS_DIR
from freetoken.prefix.anchors import Anchor, AnchorKind, AnchorMarkers, AnchorPolicy, find_anchors
from freetoken.tokenizer.tokenizer import Tokenizer
from harness_adapters import HarnessAdapter, get_adapter

K = AnchorKind
BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}
OPENERS = {
    K.TURN_START: tuple(f"<|im_start|>{r}\n" for r in ("system", "user", "assistant")),
    K.THINKING_START: ("<think>\n",),
    K.TOOL_OUTPUT_START: ("<tool_response>\n",),
    K.GENERATION_START: ("",),
    K.GENERATION_END: ("",),
}
TEMPLATES = ("qwen3_moe", "qwen3_next", "qwen3_5_moe")


@lru_cache(maxsize=1)
def _tok() -> Tokenizer:
    return Tokenizer.from_pretrained(ASSETS_DIR / "tokenizer")


@lru_cache(maxsize=None)
def _template(model_type: str) -> ChatTemplate:
    return ChatTemplate.for_model(None, model_type)


def call(cid: str, command: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": "bash", "arguments": {"command": command}}}


def asst(command: str, cid: str, reasoning: str | None = None) -> dict:
    msg = {"role": "assistant", "content": "", "tool_calls": [call(cid, command)]}
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


def tool(cid: str, content: str) -> dict:
    return {"role": "tool", "content": content, "tool_call_id": cid}


@dataclass(frozen=True)
class Step:
    """Token view of one replayed agent step."""

    prompt: list[int]   # previous request's prompt ids
    served: list[int]   # prompt + the generated reply's ids
    diverge: int        # first index where the next prompt differs from ``served``

    def anchors(self, policy: AnchorPolicy) -> list[Anchor]:
        found = list(find_anchors(self.prompt, AnchorMarkers.from_tokenizer(_tok()), policy))
        if K.GENERATION_END in policy.kinds:
            found.append(Anchor(len(self.served), K.GENERATION_END))
        return found

    def covering(self, policy: AnchorPolicy) -> tuple[Anchor, str]:
        """The nearest anchor at or before the divergence and the text between them."""
        best = max((a for a in self.anchors(policy) if a.position <= self.diverge),
                   key=lambda a: a.position)
        return best, _tok().decode(self.served[best.position:self.diverge])

    def covered(self, policy: AnchorPolicy) -> bool:
        best, gap = self.covering(policy)
        return any(opener.startswith(gap) for opener in OPENERS[best.kind])


def replay(model_type: str, adapter: HarnessAdapter, history: list[dict], reply: dict,
           results: list[dict], before: dict | None = None, after: dict | None = None) -> Step:
    """One step: ``before``/``after`` are the simulate_edits options of the previous and the
    next request (the same view-type edits apply to both; a compaction only to the next)."""
    tpl, tok = _template(model_type), _tok()
    sent = adapter.simulate_edits(history, **(before or {}))
    prompt_text = tpl.render(sent, tools=[BASH])
    full = tpl.render(sent + [reply], tools=[BASH], add_generation_prompt=False)
    assert full.startswith(prompt_text)
    generated = full[len(prompt_text):]
    generated = generated[:generated.index("<|im_end|>") + len("<|im_end|>")]
    prompt = tok.encode(prompt_text)
    served = prompt + tok.encode(generated)
    nxt = tok.encode(tpl.render(adapter.simulate_edits(history + [reply] + results, **(after or {})),
                                tools=[BASH]))
    diverge = next((i for i, (a, b) in enumerate(zip(served, nxt)) if a != b), min(len(served), len(nxt)))
    return Step(prompt, served, diverge)


def _declared(adapter: HarnessAdapter, code: str) -> AnchorKind:
    return next(b.anchor for b in adapter.boundaries if b.code == code)


SYSTEM = {"role": "system", "content": "You are a coding agent."}


def _openclaw_tool_loop(internal_context: bool) -> tuple[list[dict], dict, list[dict]]:
    """``(history, reply, results)`` of the second tool step of a turn: E1 strips the reasoning
    just generated. With ``internal_context`` both requests end with OpenClaw 2026.9's
    internal-context user message (E10)."""
    ctx = [{"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\ncwd /work"}] \
        if internal_context else []
    history = [SYSTEM, {"role": "user", "content": "How many files are there?"},
               asst("ls", "c1", "List the directory first."), tool("c1", "a.txt\nb.txt")]
    reply = asst("ls | wc -l", "c2", "Two names shown; count them with wc to be sure.")
    return history + ctx, reply, [tool("c2", "2")] + ctx


@pytest.mark.parametrize("model_type", TEMPLATES)
def test_openclaw_e1_is_covered(model_type: str) -> None:
    openclaw = get_adapter("openclaw")
    step = replay(model_type, openclaw, *_openclaw_tool_loop(internal_context=False))
    assert step.covered(openclaw.anchor_policy())
    best, gap = step.covering(openclaw.anchor_policy())
    if model_type == "qwen3_moe":  # the reply opened its own think block: diverges at the reply
        assert (best.kind, best.position, gap) == (K.GENERATION_START, len(step.prompt), "")
    else:  # the generation prompt opened it; "\n" + "\n</think>" re-tokenise as "\n\n"
        assert (best.kind, gap) == (_declared(openclaw, "E1"), "<think>")
        assert best.position == len(step.prompt) - 2
        assert not step.covered(AnchorPolicy.default())


@pytest.mark.parametrize("model_type", TEMPLATES)
def test_openclaw_internal_context_move_is_covered(model_type: str) -> None:
    openclaw = get_adapter("openclaw")
    step = replay(model_type, openclaw, *_openclaw_tool_loop(internal_context=True))
    best, gap = step.covering(openclaw.anchor_policy())
    assert (best.kind, gap) == (_declared(openclaw, "E10"), "<|im_start|>")


def _swe_history(steps: int) -> list[dict]:
    history = [SYSTEM, {"role": "user", "content": "<issue>division by zero</issue>"}]
    for k in range(steps):
        history += [asst(f"cat f{k}.py", f"c{k}"),
                    tool(f"c{k}", "\n".join(f"{j}: x = {j}" for j in range(k + 2)))]
    return history


@pytest.mark.parametrize("model_type", TEMPLATES)
def test_swe_agent_s1_is_covered(model_type: str) -> None:
    swe = get_adapter("swe_agent")
    # 5 tool observations + the instance: nothing elided yet; the 6th pushes the 1st out
    step = replay(model_type, swe, _swe_history(5), asst("python f5.py", "c5"), [tool("c5", "ok")])
    policy = swe.anchor_policy()
    assert step.covered(policy)
    best, gap = step.covering(policy)
    assert (best.kind, gap) == (_declared(swe, "S1"), "<tool_response>\n")
    assert not step.covered(AnchorPolicy.default())


def _three_user_turns() -> tuple[list[dict], dict, list[dict]]:
    history = [SYSTEM]
    for k in range(3):
        history += [{"role": "user", "content": f"Step {k}: show f{k}.py"},
                    asst(f"cat f{k}.py", f"c{k}"), tool(f"c{k}", f"x = {k}\n" * 20)]
    return history, asst("python f2.py", "c3"), [tool("c3", "ok")]


CONVERSATIONS = {
    "openclaw": lambda: _openclaw_tool_loop(internal_context=False),
    "swe": lambda: (_swe_history(6), asst("python f6.py", "c6"), [tool("c6", "ok")]),
    "three_turns": _three_user_turns,
}


@pytest.mark.parametrize("name, code, before, after, conversation", [
    ("openclaw", "E9", {}, {"summary": "Listed the files."}, "openclaw"),
    ("opencode", "P2", {}, {"summary": "## Goal\ncount files", "tail_turns": 0}, "openclaw"),
    ("claude_code", "C5", *[{"clear_tool_results": True, "compactable_tools": ("bash",)}] * 2, "swe"),
    ("opencode", "P1", {}, {"prune": True, "prune_protect": 5, "prune_minimum": 0,
                            "count_tokens": len}, "three_turns"),
    ("codex", "X1", {}, {"summary": "Summary: showed f0-f2."}, "three_turns"),
])
def test_other_edits_are_covered_by_their_boundary_anchor(name: str, code: str, before: dict,
                                                         after: dict, conversation: str) -> None:
    """Compaction (E9, P2) and P1 prune change the next request only (persistent edits made
    after the previous one); C5 is a view applied to both. C5 and P1 are opt-in, so their
    anchor is added to the policy, as for a server configured for them."""
    adapter = get_adapter(name)
    step = replay("qwen3_next", adapter, *CONVERSATIONS[conversation](), before, after)
    assert step.diverge < len(step.prompt) - 5  # inside the history, not the re-rendered tail
    policy = AnchorPolicy(adapter.anchor_policy().kinds | {_declared(adapter, code)})
    best, gap = step.covering(policy)
    assert best.kind == _declared(adapter, code) and step.covered(policy), (best, gap)


@pytest.mark.parametrize("model_type", TEMPLATES)
def test_append_only_diverges_only_in_the_re_rendered_tail(model_type: str) -> None:
    """Control (B0): mini-swe-agent edits nothing, so the next prompt differs from what was
    served only where the last generation is re-tokenised. qwen3_moe: the reply's own empty
    think block disappears once it is no longer last, at the generation start. qwen3_next and
    qwen3_5_moe: the "\n" sampled after the prompt's "<think>\n" merges into "\n\n" in the
    re-rendered empty think block, one token before the generation start, so the base policy's
    nearest checkpoint is the generation prompt's turn start (4 tokens back) and a
    thinking_start checkpoint would be 1 token back."""
    mini = get_adapter("mini_swe_agent")
    step = replay(model_type, mini, _swe_history(3), asst("ls", "c3"), [tool("c3", "x")])
    best, gap = step.covering(mini.anchor_policy())
    if model_type == "qwen3_moe":
        assert step.diverge == len(step.prompt) and (best.kind, gap) == (K.GENERATION_START, "")
        return
    assert step.diverge == len(step.prompt) - 1
    assert (best.kind, gap) == (K.TURN_START, "<|im_start|>assistant\n<think>")
    assert step.covering(AnchorPolicy.all()) == (Anchor(len(step.prompt) - 2, K.THINKING_START), "<think>")
