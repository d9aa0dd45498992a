"""The GLM-4.5 tool-call form of the forced-call grammar, on the GLM tokenizer (whose
``<tool_call>`` / ``<arg_key>`` / ``<arg_value>`` tags are special tokens): the calls its chat
template renders are accepted token by token, bad arguments refused, and every walk the mask
allows parses into valid calls."""

from __future__ import annotations

import json

import pytest
import torch

from freetoken.chat.template import ChatTemplate
from freetoken.constrain import GrammarError, tool_call_grammar
from freetoken.constrain.lark import grammar_text
from freetoken.constrain.matcher import GrammarCompiler, check_grammar
from freetoken.core import SamplingParams
from freetoken.engine.sampler import sample
from freetoken.models.tiny import cached_tiny
from freetoken.parsers import parse_output
from freetoken.parsers.events import ToolCallEvent
from freetoken.server.tools import call_form
from freetoken.tokenizer.tokenizer import Tokenizer
from tests.engine.constrained_schemas import TOOLS, WEATHER, check_call
from tests.engine.test_constrained_grammar import CALLS


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_pretrained(cached_tiny("glm4_moe"))


@pytest.fixture(scope="module")
def compiler(tok) -> GrammarCompiler:
    return GrammarCompiler(tok, tok.eos_token_ids)


def rendered(calls: list[tuple[str, dict]]) -> str:
    """The assistant text GLM's chat template writes for ``calls`` (no content)."""
    template = ChatTemplate.for_model(None, "glm4_moe")
    tool_calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                  for i, (n, a) in enumerate(calls)]
    text = template.render(
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": "", "tool_calls": tool_calls}],
        tools=TOOLS, add_generation_prompt=False,
    )
    turn = text[text.rindex("<|assistant|>"):]
    return turn[turn.index("<tool_call>"): turn.rindex("</tool_call>") + len("</tool_call>")]


def consumed(tok, matcher, text: str) -> int:
    ids = tok.encode(text)
    for n, token in enumerate(ids):
        try:
            matcher.advance(token)
        except GrammarError:
            return n
    return len(ids)


def test_the_glm_template_teaches_the_glm_form(tok) -> None:
    assert call_form(ChatTemplate.for_model(None, "glm4_moe")) == "glm"
    lark = grammar_text(tool_call_grammar([WEATHER], "glm"), GrammarCompiler(tok, (1,))._tag_ref)
    arg_key = tok.token_to_id("<arg_key>")
    assert f"<[{arg_key}]>" in lark and '"<arg_key>"' not in lark
    check_grammar(tool_call_grammar(TOOLS, "glm"))  # the text-tag variant compiles too


@pytest.mark.parametrize("which", range(len(CALLS)))
def test_template_rendered_call_is_accepted_then_only_eos(tok, compiler, which) -> None:
    matcher = compiler.matcher(tool_call_grammar(TOOLS, "glm", parallel=False))
    text = rendered([CALLS[which]])
    assert consumed(tok, matcher, text) == len(tok.encode(text))
    allowed = matcher.allowed(tok.vocab_size).nonzero().flatten().tolist()
    assert allowed == sorted(tok.eos_token_ids) and matcher.done
    (event,) = parse_output(text, TOOLS, in_reasoning=False)
    assert (event.name, json.loads(event.arguments)) == CALLS[which]


def test_parallel_calls(tok, compiler) -> None:
    matcher = compiler.matcher(tool_call_grammar(TOOLS, "glm"))
    text = rendered(CALLS)
    assert consumed(tok, matcher, text) == len(tok.encode(text))
    events = parse_output(text, TOOLS, in_reasoning=False)
    assert [(e.name, json.loads(e.arguments)) for e in events] == CALLS


@pytest.mark.parametrize("bad", [
    ("get_weather", {"city": "Rome"}),  # not in the enum
    ("get_weather", {"city": "Oslo", "days": 8}),  # above maximum
    ("get_weather", {"city": "Oslo", "wind": 1}),  # undeclared argument
    ("set_zip", {"zip": "03106", "note": "toolong"}),  # maxLength 6
    ("set_zip", {}),  # missing required zip
])
def test_invalid_arguments_are_refused(tok, compiler, bad) -> None:
    matcher = compiler.matcher(tool_call_grammar(TOOLS, "glm"))
    text = rendered([bad])
    assert consumed(tok, matcher, text) < len(tok.encode(text))


def test_random_walks_always_parse_into_valid_calls(tok, compiler) -> None:
    spec = tool_call_grammar(TOOLS, "glm")
    gen = torch.Generator().manual_seed(11)
    eos = list(tok.eos_token_ids)
    names = set()
    for _ in range(12):
        matcher, ids = compiler.matcher(spec), []
        while not ids or ids[-1] not in eos:
            assert len(ids) < 400
            logits = torch.randn(tok.vocab_size, generator=gen) * 4
            logits[eos] += 4
            picked = sample(logits, SamplingParams(temperature=1.0), gen,
                            matcher.allowed(tok.vocab_size))
            matcher.advance(picked.token_id)
            ids.append(picked.token_id)
        text = tok.decode(ids[:-1])
        events = parse_output(text, TOOLS, in_reasoning=False)
        assert events and all(isinstance(e, ToolCallEvent) for e in events), (text, events)
        for event in events:
            check_call(event.name, event.arguments)
            names.add(event.name)
    assert names == {"get_weather", "set_zip", "search"}
