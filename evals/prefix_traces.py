"""Real agent conversations of ../shared/traces as request sequences for ``bench_prefix.py``.

Loading: one :class:`Thread` per ``.jsonl`` file (one model call per line, format in
``traces/README.md``). Files of one session (same name before ``__``) are merged into one
:class:`Trace` in recorded order:

* claude-trace captures carry the capture row of every call (``meta.row``): main loop, haiku side
  calls and the post-compaction session are merged by row;
* Claude Code ``~/.claude`` transcripts have no timestamps: each Task sub-agent thread is inserted
  right after the main-thread call whose response holds its ``tool_use`` id
  (``meta.parent_task_tool_use_id``), sub-agents spawned by the same call round-robin (they ran
  concurrently), before the main call that reads their results;
* other multi-file sessions (OpenCode ``session1`` + its ``task`` child): the first file is the
  parent, each further file is inserted after the parent's n-th call of a tool named ``task``.

Rendering (:class:`Renderer`): as the FreeToken server renders the request: Anthropic calls
through ``freetoken.server.messages.from_anthropic`` (thinking off unless requested, as
``/v1/messages`` does), OpenAI calls through ``from_openai`` (template default: thinking on), the
project's chat template and the checkpoint's tokenizer; harness edits of ``harness_adapters``
per group :class:`Variant` (Anthropic histories go through the Claude Code adapter's
``normalize``, which removes the attribution line: that line alone makes the server pick it). The scripted reply is the recorded response rendered as the last
assistant turn (what the next request of a tool loop re-renders), up to its ``<|im_end|>``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from freetoken.chat.template import ChatTemplate
from freetoken.server.anthropic_chat import enable_thinking
from freetoken.server.anthropic_protocol import AnthropicMessage, CountTokensRequest
from freetoken.server.messages import from_anthropic, from_openai
from freetoken.server.openai_protocol import ChatCompletionRequest, ChatMessage
from freetoken.server.prompt import render_prompt
from freetoken.server.tools import anthropic_tools, openai_tools
from freetoken.tokenizer.tokenizer import Tokenizer
from evals.replay import traces as replay_traces
from harness_adapters import get_adapter

IM_END = "<|im_end|>"
CLAUDE_CODE = get_adapter("claude_code")
OPENCLAW = get_adapter("openclaw")
SWE_AGENT = get_adapter("swe_agent")


@dataclass(frozen=True)
class TraceCall:
    """One recorded model call.

    Attributes:
        thread: the file (stem) it comes from.
        turn: its index in that file.
        protocol: ``"anthropic"`` (Messages blocks) or ``"openai"`` (chat messages).
        messages: the request history as the harness sent it.
        tools: the request's tools (wire format), or None when not recorded.
        response: the recorded reply, or None.
        row: capture row (claude-trace ``meta.row``), or None.
    """

    thread: str
    turn: int
    protocol: str
    messages: list
    tools: list | None
    response: dict | None
    row: int | None = None


@dataclass(frozen=True)
class Thread:
    """One trace file: its calls and the metadata of its first line."""

    name: str
    calls: tuple[TraceCall, ...]
    meta: dict


@dataclass(frozen=True)
class Trace:
    """One replay unit (served by one fresh engine): calls in recorded order."""

    name: str
    calls: tuple[TraceCall, ...]


@dataclass(frozen=True)
class Variant:
    """Harness behaviour applied on top of the recorded requests.

    Attributes:
        elide_observations: SWE-agent ``last_n_observations`` window (0: off).
        synthetic_thinking: the model generates seeded reasoning (~150-600 tokens) before every
            reply and OpenClaw's E1 strips it from the history (thinking rendered on).
    """

    elide_observations: int = 0
    synthetic_thinking: bool = False


@dataclass(frozen=True)
class Group:
    """A row group of the benchmark table: trace folders, a file filter and a variant."""

    key: str
    title: str
    folders: tuple[str, ...]
    variant: Variant
    select: Callable[[str], bool] = lambda stem: True


_SWE = ("W2_coding_agent_swebench", "W2_coding_agent_other")
GROUPS: tuple[Group, ...] = (
    Group("w2-swe", "W2 SWE-agent", _SWE, Variant()),
    Group("w2-swe-elide5", "W2 SWE-agent, last-5 elision", _SWE, Variant(elide_observations=5),
          lambda stem: stem.startswith("sweagent_")),
    Group("w2-opencode", "W2 OpenCode", ("W2_coding_agent_opencode",), Variant()),
    Group("w3-claude-code", "W3 Claude Code, interleaved", ("W3_claude_code",), Variant()),
    Group("w4-openclaw", "W4 OpenClaw, thinking stripped", ("W4_openclaw_assistant",),
          Variant(synthetic_thinking=True)),
    Group("w4-openclaw-recorded", "W4 OpenClaw, as recorded", ("W4_openclaw_assistant",),
          Variant()),
)


# ---------------------------------------------------------------------------------- loading
def load_thread(path: Path) -> Thread:
    """Read one trace file (``evals.replay.traces.load_thread``) as :class:`TraceCall` s.

    Raises:
        FileNotFoundError: no such file. ValueError: an empty file, a line that is not JSON or a
            line without messages.
    """
    thread = replay_traces.load_thread(path)
    calls = []
    for i, line in enumerate(thread.lines):
        row = (line.get("meta") or {}).get("row")
        calls.append(TraceCall(path.stem, i, thread.protocol, line["messages"], line.get("tools"),
                               line.get("response"), row if isinstance(row, int) else None))
    return Thread(path.stem, tuple(calls), thread.meta)


def _round_robin(threads: list[Thread]) -> list[TraceCall]:
    out, depth = [], max((len(t.calls) for t in threads), default=0)
    for k in range(depth):
        out += [t.calls[k] for t in threads if k < len(t.calls)]
    return out


def merge_session(name: str, threads: list[Thread]) -> Trace:
    """One trace from the files of one session, in recorded order (module docstring)."""
    if len(threads) == 1:
        return Trace(name, threads[0].calls)
    calls = [c for t in threads for c in t.calls]
    if all(c.row is not None for c in calls):
        return Trace(name, tuple(sorted(calls, key=lambda c: c.row)))
    main = next((t for t in threads if t.name.endswith("__main")), threads[0])
    subs = [t for t in threads if t is not main]
    spawn = replay_traces.spawn_points([c.response for c in main.calls], subs)
    merged: list[TraceCall] = []
    for i, call in enumerate(main.calls):
        merged.append(call)
        merged += _round_robin(spawn.get(i, []))
    return Trace(name, tuple(merged))


def group_traces(group: Group, traces_dir: Path) -> list[Trace]:
    """The traces of ``group`` under ``traces_dir`` (sessions merged), sorted by name.

    Raises:
        FileNotFoundError: none of the group's folders exists under ``traces_dir``.
    """
    folders = [traces_dir / f for f in group.folders if (traces_dir / f).is_dir()]
    if not folders:
        raise FileNotFoundError(f"no {' / '.join(group.folders)} folder under {traces_dir}")
    sessions: dict[str, list[Thread]] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.jsonl")):
            if group.select(path.stem):
                sessions.setdefault(path.stem.split("__")[0], []).append(load_thread(path))
    return [merge_session(name, threads) for name, threads in sorted(sessions.items())]


# ---------------------------------------------------------------------------------- rendering
_WORDS = ("the", "user", "asks", "for", "a", "check", "of", "their", "calendar", "and", "inbox",
          "so", "first", "I", "should", "look", "at", "what", "tool", "fits", "then", "read",
          "result", "carefully", "before", "answering", "maybe", "time", "event", "email",
          "reply", "short", "plan", "step", "next", "this", "means", "it", "is", "not", "clear",
          "whether", "need", "more", "context", "let", "me", "think", "about", "options")


def synthetic_reasoning(message: dict) -> str:
    """Seeded stand-in reasoning for an assistant message (110-450 words, ~150-600 tokens),
    a function of its content and tool calls only, so the reply and its later copies in the
    history get the same text."""
    calls = [(c.get("function", {}).get("name"), c.get("function", {}).get("arguments"))
             for c in message.get("tool_calls") or []]
    key = json.dumps([message.get("content"), calls], sort_keys=True, default=str)
    rng = random.Random(hashlib.sha256(key.encode("utf-8")).hexdigest())
    words = [rng.choice(_WORDS) for _ in range(rng.randint(110, 450))]
    sentences = [" ".join(words[i:i + 12]).capitalize() + "." for i in range(0, len(words), 12)]
    return " ".join(sentences)


def _openai_message(msg: dict) -> dict:
    if msg.get("role") == "tool" and not msg.get("tool_call_id"):
        msg = {**msg, "tool_call_id": ""}  # the Gemini wire format has no call ids
    return msg


def template_request(call: TraceCall) -> tuple[list[dict], list[dict] | None, bool | None]:
    """``(messages, tools, enable_thinking)`` of ``call`` as the FreeToken server renders it.

    Raises:
        pydantic.ValidationError / freetoken.server.errors.APIError: a request the server
            would reject with a 400.
    """
    if call.protocol == "anthropic":
        msgs, system = call.messages, None
        if msgs[0].get("role") == "system":
            system, msgs = msgs[0].get("content"), msgs[1:]
        req = CountTokensRequest.model_validate(
            {"system": system, "messages": msgs, "tools": call.tools})
        return CLAUDE_CODE.normalize(from_anthropic(req.system, req.messages)), \
            anthropic_tools(req).tools, enable_thinking(req)
    req = ChatCompletionRequest.model_validate(
        {"messages": [_openai_message(m) for m in call.messages], "tools": call.tools})
    return from_openai(req.messages), openai_tools(req).tools, None


def template_response(call: TraceCall) -> dict | None:
    """The recorded response as a template assistant message, or None."""
    r = call.response
    if not r:
        return None
    if call.protocol == "anthropic":
        content = r.get("content") if r.get("content") is not None else ""
        return from_anthropic(None, [AnthropicMessage(role="assistant", content=content)])[0]
    fields = {k: r.get(k) for k in ("content", "tool_calls", "reasoning_content")}
    return from_openai([ChatMessage.model_validate({"role": "assistant", **fields})])[0]


@dataclass(frozen=True)
class RenderedCall:
    """One request ready for the engine.

    Attributes:
        thread: the trace file it comes from.
        prompt_ids: the rendered prompt's token ids.
        reply_ids: the scripted output (ends with ``<|im_end|>``, an EOS id).
        aligned: ``prompt + reply`` tokenises exactly like the text ``prompt + reply``, so a
            later request that re-renders the reply unchanged repeats these ids token for
            token (False e.g. when the reply's first characters merge with the generation
            prompt's trailing newline).
    """

    thread: str
    prompt_ids: tuple[int, ...]
    reply_ids: tuple[int, ...]
    aligned: bool


class Renderer:
    """Renders trace calls with the server's conversion, a chat template and a tokenizer.

    Args:
        tokenizer: the checkpoint's tokenizer (must know ``<|im_end|>``).
        template: the chat template (``ChatTemplate.for_model(tok.chat_template, "qwen3_next")``).

    Raises:
        ValueError: the tokenizer has no ``<|im_end|>``.
    """

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate) -> None:
        self.tok = tokenizer
        self.template = template
        self.im_end = tokenizer.token_to_id(IM_END)
        if self.im_end is None:
            raise ValueError(f"tokenizer has no {IM_END} token")
        self.unaligned = 0

    def render(self, call: TraceCall, variant: Variant) -> RenderedCall:
        """Prompt and scripted reply of ``call`` under ``variant``."""
        msgs, tools, thinking = template_request(call)
        resp = template_response(call)
        if variant.elide_observations:
            msgs = SWE_AGENT.simulate_edits(msgs, n=variant.elide_observations)
        if variant.synthetic_thinking:
            thinking = True
            msgs = OPENCLAW.simulate_edits([_with_reasoning(m) for m in msgs])
            resp = _with_reasoning(resp) if resp is not None else None
        prompt = render_prompt(self.template, self.tok, msgs, tools, thinking)
        if resp is None:
            return RenderedCall(call.thread, prompt.token_ids, (self.im_end,), False)
        full = self.template.render(msgs + [resp], tools=tools, add_generation_prompt=False,
                                    enable_thinking=thinking)
        if full.startswith(prompt.text):
            reply_text = full[len(prompt.text):]
            reply_text = reply_text[: reply_text.rfind(IM_END) + len(IM_END)]
        else:  # the template renders the last turn differently: the reply's content alone
            reply_text = str(resp.get("content") or "") + IM_END
        reply, aligned = self._reply_ids(prompt.text, prompt.token_ids, reply_text)
        self.unaligned += not aligned
        return RenderedCall(call.thread, prompt.token_ids, reply, aligned)

    def _reply_ids(self, prompt_text: str, prompt_ids: tuple[int, ...], reply_text: str
                   ) -> tuple[tuple[int, ...], bool]:
        # Added tokens split the text before BPE, so only the prompt's last turn (from its last
        # <|im_start|>) can merge with the reply.
        cut = prompt_text.rfind("<|im_start|>")
        tail = prompt_text[max(cut, 0):]
        tail_ids = self.tok.encode(tail)
        if tuple(tail_ids) != prompt_ids[len(prompt_ids) - len(tail_ids):]:
            tail, tail_ids = prompt_text, list(prompt_ids)
        joint = self.tok.encode(tail + reply_text)
        if joint[: len(tail_ids)] == tail_ids and len(joint) > len(tail_ids):
            return tuple(joint[len(tail_ids):]), True
        return tuple(self.tok.encode(reply_text)), False


def _with_reasoning(msg: dict) -> dict:
    if msg.get("role") != "assistant":
        return msg
    return {**msg, "reasoning_content": synthetic_reasoning(msg)}
