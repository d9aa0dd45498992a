"""The harmony (gpt-oss) form of the forced-call grammar, on the tiny gpt_oss tokenizer (whose
harmony tokens are special): the call message templates/gpt_oss.jinja renders is accepted token
by token and then only EOS, an analysis message may come first only with ``reasoning``, bad
arguments are refused, and every walk the mask allows parses (HarmonyParser) into one valid
call."""

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
from freetoken.parsers import ReasoningDelta, ToolCallEvent, parse_harmony
from freetoken.server.tools import call_form
from tests.engine.constrained_schemas import TOOLS, WEATHER, check_call
from tests.engine.test_constrained_grammar import CALLS

ANALYSIS = "<|channel|>analysis<|message|>Plan: call <b>it</b>.\n\n<|end|><|start|>assistant"


@pytest.fixture(scope="module")
def tok(harmony_tokenizer):
    return harmony_tokenizer


@pytest.fixture(scope="module")
def compiler(tok) -> GrammarCompiler:
    return GrammarCompiler(tok, tok.eos_token_ids)


def rendered(calls: list[tuple[str, dict]]) -> str:
    """The call message the gpt_oss template writes for one call, as the model generates it
    (after the prompt's ``<|start|>assistant``, without the ``<|call|>`` stop token)."""
    template = ChatTemplate.for_model(None, "gpt_oss")
    tool_calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                  for i, (n, a) in enumerate(calls)]
    text = template.render(
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": "", "tool_calls": tool_calls}],
        tools=TOOLS, add_generation_prompt=False, current_date="2025-01-01",
    )
    turn = text[text.rindex("<|start|>user"):]
    start = turn.index("<|channel|>commentary to=")
    return turn[start: turn.index("<|call|>", start)]


def consumed(tok, matcher, text: str) -> int:
    ids = tok.encode(text)
    for n, token in enumerate(ids):
        try:
            matcher.advance(token)
        except GrammarError:
            return n
    return len(ids)


def allowed_ids(tok, matcher) -> list[int]:
    return matcher.allowed(tok.vocab_size).nonzero().flatten().tolist()


def test_the_gpt_oss_template_teaches_the_harmony_form(tok) -> None:
    assert call_form(ChatTemplate.for_model(None, "gpt_oss")) == "harmony"
    spec = tool_call_grammar([WEATHER], "harmony", reasoning=True)
    lark = grammar_text(spec, GrammarCompiler(tok, (1,))._tag_ref)
    channel = tok.token_to_id("<|channel|>")
    assert f"<[{channel}]>" in lark and '"<|channel|>"' not in lark
    text_tags = grammar_text(spec)
    assert '"<|channel|>"' in text_tags and "analysis_text[lazy]" in text_tags
    check_grammar(tool_call_grammar(TOOLS, "harmony", reasoning=True))


def test_one_call_whatever_parallel_says() -> None:
    assert tool_call_grammar(TOOLS, "harmony", parallel=True).parallel is False


@pytest.mark.parametrize("which", range(len(CALLS)))
def test_template_rendered_call_is_accepted_then_only_eos(tok, compiler, which) -> None:
    matcher = compiler.matcher(tool_call_grammar(TOOLS, "harmony"))
    text = rendered([CALLS[which]])
    assert consumed(tok, matcher, text) == len(tok.encode(text))
    assert allowed_ids(tok, matcher) == sorted(tok.eos_token_ids) and matcher.done
    (event,) = parse_harmony(text, TOOLS)
    assert (event.name, json.loads(event.arguments)) == CALLS[which]


def test_an_analysis_message_may_come_first_only_with_reasoning(tok, compiler) -> None:
    text = ANALYSIS + rendered([CALLS[0]])
    free = compiler.matcher(tool_call_grammar(TOOLS, "harmony", reasoning=True))
    assert consumed(tok, free, text) == len(tok.encode(text)) and free.done
    events = parse_harmony(text, TOOLS)
    assert [type(e) for e in events] == [ReasoningDelta, ToolCallEvent]
    strict = compiler.matcher(tool_call_grammar(TOOLS, "harmony"))
    assert consumed(tok, strict, text) < len(tok.encode(text))
    direct = compiler.matcher(tool_call_grammar(TOOLS, "harmony", reasoning=True))
    call = rendered([CALLS[1]])
    assert consumed(tok, direct, call) == len(tok.encode(call)) and direct.done


@pytest.mark.parametrize("bad", [
    ("get_weather", {"city": "Rome"}),  # not in the enum
    ("get_weather", {"city": "Oslo", "wind": 1}),  # undeclared argument
    ("set_zip", {"zip": "3106"}),  # four digits
    ("set_zip", {}),  # missing required zip
])
def test_invalid_arguments_are_refused(tok, compiler, bad) -> None:
    matcher = compiler.matcher(tool_call_grammar(TOOLS, "harmony"))
    text = rendered([bad])
    assert consumed(tok, matcher, text) < len(tok.encode(text))


def test_named_tool_refuses_the_others(tok, compiler) -> None:
    spec = tool_call_grammar(TOOLS, "harmony", only="set_zip")
    weather = rendered([CALLS[0]])
    assert consumed(tok, compiler.matcher(spec), weather) < len(tok.encode(weather))


def test_a_name_the_header_cannot_hold_is_a_grammar_error() -> None:
    bad = {"type": "function", "function": {"name": "two words", "parameters": {}}}
    with pytest.raises(GrammarError, match="harmony recipient"):
        grammar_text(tool_call_grammar([bad], "harmony"))


def test_random_walks_always_parse_into_one_valid_call(tok, compiler) -> None:
    spec = tool_call_grammar(TOOLS, "harmony")
    gen = torch.Generator().manual_seed(5)
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
        (event,) = parse_harmony(tok.decode(ids[:-1]), TOOLS)
        assert isinstance(event, ToolCallEvent), event
        check_call(event.name, event.arguments)
        names.add(event.name)
    assert names == {"get_weather", "set_zip", "search"}
