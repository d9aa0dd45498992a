"""Helpers of the engine-level prefix-reuse tests: a synchronous engine over a tiny checkpoint,
agent-style conversations, and the expected reuse computed from the rendered text."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from freetoken.chat.template import ChatTemplate
from freetoken.core import EngineInfo, GenerationOutput, GenerationRequest, SamplingParams
from freetoken.engine.engine import Engine
from freetoken.models.registry import load_model
from freetoken.models.tiny import cached_tiny
from freetoken.prefix.build import CacheConfig
from freetoken.tokenizer.tokenizer import Tokenizer

BLOCK_MARKERS = ("<|im_start|>", "<think>", "<tool_call>", "<tool_response>")

BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command in the repository.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}

SYSTEM = ("You are a careful coding agent working in a git repository. Read files before "
          "editing them, run the tests after every change, and keep answers short.")


@lru_cache(maxsize=2)
def tiny(arch: str) -> tuple[Path, object, Tokenizer, ChatTemplate]:
    """(checkpoint path, fp32 model, tokenizer, chat template) of the tiny ``arch`` checkpoint."""
    path = cached_tiny(arch)
    tok = Tokenizer.from_pretrained(path)
    return path, load_model(path), tok, ChatTemplate.for_model(tok.chat_template, arch)


def make_engine(arch: str, budget: int = 64, **cache) -> Engine:
    """A synchronous engine over the shared tiny model with a fresh prefix cache."""
    path, model, tok, _ = tiny(arch)
    cfg = model.config
    info = EngineInfo(str(path), cfg.model_type, 4096, cfg.vocab_size, tok.eos_token_ids)
    return Engine(model, tok, info, max_num_batched_tokens=budget, cache=CacheConfig(**cache))


def call(tool_id: str, command: str, thought: str | None = None) -> dict:
    """An assistant message with one bash tool call (and reasoning when given)."""
    msg = {"role": "assistant", "content": "", "tool_calls": [{
        "id": tool_id, "type": "function",
        "function": {"name": "bash", "arguments": {"command": command}}}]}
    if thought is not None:
        msg["reasoning_content"] = thought
    return msg


def result(tool_id: str, text: str) -> dict:
    """A tool message answering ``tool_id``."""
    return {"role": "tool", "tool_call_id": tool_id, "content": text}


def agent_turns(n: int) -> list[dict]:
    """System + user task + ``n`` (tool call, tool output) rounds."""
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "The parser drops the last field; fix it."}]
    for i in range(n):
        msgs.append(call(f"c{i}", f"sed -n {i * 10},{i * 10 + 9}p parser.py",
                         thought=f"Read chunk {i} of the parser."))
        body = "\n".join(f"    field_{i}_{j} = line.split(',')[{j}]" for j in range(6))
        msgs.append(result(f"c{i}", f"def parse_{i}(line):\n{body}\n    return fields"))
    return msgs


def render(arch: str, messages: list[dict]) -> tuple[str, tuple[int, ...]]:
    """Prompt text (with the generation prompt) and its token ids."""
    _, _, tok, template = tiny(arch)
    text = template.render(messages, tools=[BASH])
    return text, tuple(tok.encode(text))


def expected_reuse(arch: str, before: str, after: str) -> int:
    """Tokens of ``after`` a perfect anchor policy reuses after ``before`` was served: up to the
    start of the block holding the first edited character; when ``after`` only appends to
    ``before``, the common token prefix (the generation prompt's last token may merge with what
    follows it); for an identical prompt all but the last token (its logits are needed)."""
    _, _, tok, _ = tiny(arch)
    p1, p2 = tok.encode(before), tok.encode(after)
    if p1 == p2:
        return len(p2) - 1
    if after.startswith(before):
        return next((i for i, (a, b) in enumerate(zip(p1, p2)) if a != b), len(p1))
    div = next(i for i, (a, b) in enumerate(zip(before, after)) if a != b)
    start = max(before.rfind(m, 0, div + len(m)) for m in BLOCK_MARKERS)
    return len(tok.encode(before[:start]))


def serve(engine: Engine, prompt: tuple[int, ...], key: int, max_tokens: int = 4,
          anchors=None) -> list[GenerationOutput]:
    """Run one greedy request alone to completion (with its own anchor policy when given);
    returns its chunks."""
    chunks: list[GenerationOutput] = []
    req = GenerationRequest(f"r{key}", prompt, SamplingParams(max_tokens=max_tokens,
                                                              temperature=0.0, ignore_eos=True),
                            anchors=anchors)
    engine.add_request(key, req, chunks.append)
    while engine.step():
        pass
    assert chunks[-1].finish_reason == "length", chunks[-1]
    return chunks


def ids(chunks: list[GenerationOutput]) -> list[int]:
    """Generated ids of a chunk stream."""
    return [t for c in chunks for t in c.token_ids]
