"""The tool-call grammar (freetoken.constrain) against llguidance and the real output parser.

Every call the chat templates render must be accepted token by token, every walk the mask allows
must parse into calls whose arguments satisfy the schemas, and the usual mistakes (another tool,
a value outside an enum or range, an undeclared argument, "3106" for a five-digit zip) must be
refused.
"""

from __future__ import annotations

import json

import pytest
import torch

from freetoken.chat.template import ChatTemplate
from freetoken.constrain import GrammarError, ToolCallGrammar, ToolSchema, tool_call_grammar
from freetoken.constrain.lark import close_objects, grammar_text
from freetoken.constrain.matcher import GrammarCompiler, check_grammar, unpack_bitmask
from freetoken.core import SamplingParams
from freetoken.engine.sampler import sample
from freetoken.parsers import parse_output
from freetoken.parsers.events import ToolCallEvent
from tests.engine.constrained_schemas import SEARCH, TOOLS, WEATHER, ZIP, check_call
from tests.engine.helpers import ENDOFTEXT, IM_END, tokenizer

EOS = (IM_END, ENDOFTEXT)
TOOL_CALL, TOOL_CALL_END, THINK_END = 8206, 8207, 8217
TEMPLATES = {"json": "qwen3_next", "xml": "qwen3_5_moe"}
CALLS = [
    ("get_weather", {"city": "Oslo", "days": 7, "unit": "f"}),
    ("set_zip", {"zip": "03106", "note": "a\n</b"}),
    ("search", {"filter": {"tags": ["b", "a"], "limit": -3, "exact": False}, "mode": "deep"}),
]


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler(tokenizer(), EOS)


def rendered(form: str, calls: list[tuple[str, dict]]) -> str:
    """The assistant text the model's chat template writes for ``calls`` (no content)."""
    template = ChatTemplate.for_model(None, TEMPLATES[form])
    tool_calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                  for i, (n, a) in enumerate(calls)]
    text = template.render(
        [{"role": "user", "content": "go"},
         {"role": "assistant", "content": "", "tool_calls": tool_calls}],
        tools=TOOLS, add_generation_prompt=False,
    )
    turn = text[text.rindex("<|im_start|>assistant\n"):]
    return turn[turn.index("<tool_call>"): turn.rindex("<|im_end|>")]


def consumed(matcher, text: str) -> int:
    """How many of ``text``'s tokens the matcher takes before refusing one."""
    ids = tokenizer().encode(text)
    for n, token in enumerate(ids):
        try:
            matcher.advance(token)
        except GrammarError:
            return n
    return len(ids)


def allowed_ids(matcher) -> list[int]:
    return matcher.allowed(tokenizer().vocab_size).nonzero().flatten().tolist()


@pytest.mark.parametrize("form", ["json", "xml"])
@pytest.mark.parametrize("which", range(len(CALLS)))
def test_template_rendered_call_is_accepted_then_only_eos(compiler, form, which):
    spec = tool_call_grammar(TOOLS, form, parallel=False)
    matcher = compiler.matcher(spec)
    text = rendered(form, [CALLS[which]])
    assert consumed(matcher, text) == len(tokenizer().encode(text))
    assert allowed_ids(matcher) == sorted(EOS) and matcher.done
    (event,) = parse_output(text, TOOLS, in_reasoning=False)
    assert (event.name, json.loads(event.arguments)) == CALLS[which]
    matcher.advance(IM_END)
    assert matcher.done


@pytest.mark.parametrize("form", ["json", "xml"])
def test_parallel_calls_then_eos_or_another_call(compiler, form):
    matcher = compiler.matcher(tool_call_grammar(TOOLS, form))
    assert IM_END not in allowed_ids(matcher)  # nothing is complete yet
    text = rendered(form, CALLS)
    assert consumed(matcher, text) == len(tokenizer().encode(text))
    after = allowed_ids(matcher)
    assert set(EOS) <= set(after) and TOOL_CALL in after and not matcher.done
    events = parse_output(text, TOOLS, in_reasoning=False)
    assert [(e.name, json.loads(e.arguments)) for e in events] == CALLS


@pytest.mark.parametrize("form", ["json", "xml"])
@pytest.mark.parametrize("bad", [
    ("get_weather", {"city": "Rome"}),  # not in the enum
    ("get_weather", {"city": "Oslo", "days": 8}),  # above maximum
    ("get_weather", {"city": "Oslo", "wind": 1}),  # undeclared argument
    ("set_zip", {"zip": "3106"}),  # four digits
    ("set_zip", {"zip": "03106", "note": "toolong"}),  # maxLength 6
    ("search", {"filter": {"tags": ["c"], "limit": 1}, "mode": "fast"}),  # item not in enum
    ("search", {"filter": {}, "mode": "fast"}),  # missing required limit
    ("set_zip", {}),  # missing required zip
])
def test_invalid_arguments_are_refused(compiler, form, bad):
    matcher = compiler.matcher(tool_call_grammar(TOOLS, form))
    text = rendered(form, [bad])
    assert consumed(matcher, text) < len(tokenizer().encode(text))


@pytest.mark.parametrize("form", ["json", "xml"])
def test_named_tool_refuses_the_others(compiler, form):
    spec = tool_call_grammar(TOOLS, form, only="set_zip", parallel=True)
    assert (spec.parallel, [t.name for t in spec.tools]) == (False, ["set_zip"])
    weather = rendered(form, [CALLS[0]])
    assert consumed(compiler.matcher(spec), weather) < len(tokenizer().encode(weather))
    ok = compiler.matcher(spec)
    text = rendered(form, [CALLS[1]])
    assert consumed(ok, text) == len(tokenizer().encode(text)) and ok.done


@pytest.mark.parametrize("form", ["json", "xml"])
@pytest.mark.parametrize("parallel", [False, True])
def test_random_walks_always_parse_into_valid_calls(compiler, form, parallel):
    """Sample 12 walks per case from random logits under the mask until EOS: every text parses
    into calls only (no stray text) whose arguments satisfy the schemas, one call unless
    ``parallel``."""
    spec = tool_call_grammar(TOOLS, form, parallel=parallel)
    gen = torch.Generator().manual_seed(7)
    vocab = tokenizer().vocab_size
    names, counts = set(), []
    for _ in range(12):
        matcher, ids = compiler.matcher(spec), []
        while not ids or ids[-1] not in EOS:
            assert len(ids) < 400
            logits = torch.randn(vocab, generator=gen) * 4
            logits[list(EOS)] += 4  # end after a call or two more often than not
            picked = sample(logits, SamplingParams(temperature=1.0), gen, matcher.allowed(vocab))
            matcher.advance(picked.token_id)
            ids.append(picked.token_id)
        events = parse_output(tokenizer().decode(ids[:-1]), TOOLS, in_reasoning=False)
        assert events and all(isinstance(e, ToolCallEvent) for e in events), events
        counts.append(len(events))
        for event in events:
            check_call(event.name, event.arguments)
            names.add(event.name)
    assert names == {"get_weather", "set_zip", "search"}
    assert (max(counts) > 1) == parallel


def test_reasoning_runs_free_until_think_end(compiler):
    spec = tool_call_grammar(TOOLS, "json", reasoning=True, parallel=False)
    matcher = compiler.matcher(spec)
    start = set(allowed_ids(matcher))
    # any text, </think>; no EOS and no call before the think block is closed
    assert THINK_END in start and not start & {*EOS, TOOL_CALL} and len(start) > 8000
    text = "Plan: call <b>it</b>.\n\n</think>\n\n" + rendered("json", [CALLS[0]])
    assert consumed(matcher, text) == len(tokenizer().encode(text)) and matcher.done
    events = parse_output(text, TOOLS, in_reasoning=True)
    assert [type(e).__name__ for e in events] == ["ReasoningDelta", "ToolCallEvent"]


def test_text_tags_when_the_tokenizer_has_no_such_tokens():
    spec = tool_call_grammar([WEATHER], "json", reasoning=True)
    lark = grammar_text(spec)
    assert '"<tool_call>"' in lark and "think_text[lazy]" in lark and "<[" not in lark
    check_grammar(spec)


def test_bitmask_unpacking_matches_llguidance_byte_mask(compiler):
    matcher = compiler.matcher(tool_call_grammar(TOOLS, "json", reasoning=True))
    inner = matcher._m.deep_copy()  # same state, asked through the byte-per-token API
    bias = torch.frombuffer(bytearray(inner.compute_logit_bias()), dtype=torch.uint8)
    mask = matcher.allowed(tokenizer().vocab_size + 38)  # padded model vocabulary
    assert torch.equal(mask[: tokenizer().vocab_size], bias[: tokenizer().vocab_size] > 0)
    assert not mask[tokenizer().vocab_size:].any()
    words = torch.tensor([-1, 5], dtype=torch.int32)  # all 32 ids of word 0, then ids 32 and 34
    assert unpack_bitmask(words, 66).nonzero().flatten().tolist() == list(range(32)) + [32, 34]


def test_masked_sampling_never_leaves_the_mask_and_keeps_raw_logprobs():
    logits = torch.tensor([5.0, 1.0, 0.5, 3.0, 2.0])
    allowed = torch.tensor([False, True, False, False, True])
    greedy = sample(logits, SamplingParams(temperature=0.0, logprobs=2), None, allowed)
    raw = torch.log_softmax(logits, -1)
    assert greedy.token_id == 4 and greedy.logprob == pytest.approx(float(raw[4]))
    assert [t for t, _ in greedy.top] == [0, 3]  # the raw top-2, masked or not
    gen = torch.Generator().manual_seed(0)
    draws = {sample(logits, SamplingParams(temperature=2.0, top_k=2), gen, allowed).token_id
             for _ in range(200)}
    assert draws == {1, 4}


def test_matchers_of_one_grammar_are_independent(compiler):
    spec = tool_call_grammar([WEATHER], "json")
    a, b = compiler.matcher(spec), compiler.matcher(spec)
    assert consumed(a, "<tool_call>\n{") == 3
    assert allowed_ids(b) == [TOOL_CALL] and allowed_ids(a) != [TOOL_CALL]


def test_close_objects_adds_additional_properties_false_only_where_properties_are_listed():
    schema = SEARCH["function"]["parameters"]
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["filter"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["$defs"]["mode"]
    assert close_objects({"type": "object"}) == {"type": "object"}
    kept = {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}}
    assert close_objects(kept) == kept
    assert "additionalProperties" not in schema  # the input is not modified


def test_bad_descriptions_raise_grammar_error(compiler):
    with pytest.raises(GrammarError, match="no tool named 'nope'"):
        tool_call_grammar(TOOLS, "json", only="nope")
    with pytest.raises(GrammarError, match="unknown tool-call form 'yaml'"):
        tool_call_grammar(TOOLS, "yaml")
    with pytest.raises(GrammarError, match=r"tool names must be unique, got \['f', 'f'\]"):
        ToolCallGrammar("json", (ToolSchema("f", "{}"), ToolSchema("f", "{}")))
    with pytest.raises(GrammarError, match="at least one tool"):
        ToolCallGrammar("json", ())
    with pytest.raises(GrammarError, match="parameters must be a JSON-schema object"):
        ToolCallGrammar("json", (ToolSchema("f", "[1]"),))
    arr = ToolCallGrammar("json", (ToolSchema("f", '{"type": "array"}'),))
    with pytest.raises(GrammarError, match="tool 'f': parameters must be an object schema, got"):
        compiler.matcher(arr)
    xml = ToolCallGrammar("xml", (ToolSchema("a>b", "{}"),))
    with pytest.raises(GrammarError, match="tool name 'a>b' cannot be written in the XML call"):
        compiler.matcher(xml)
    bad = ToolSchema("f", '{"properties": {"x": {"type": "strin"}}}')
    broken = ToolCallGrammar("json", (ToolSchema("ok", "{}"), bad))
    message = ("the tool schemas cannot be compiled into a grammar: tool 'f': failed to compile "
               "JSON schema: Invalid type: strin")
    with pytest.raises(GrammarError) as info:
        check_grammar(broken)
    assert str(info.value) == message
    with pytest.raises(GrammarError, match="^the tool schemas cannot be compiled into a grammar: "
                                           "failed to compile JSON schema: Invalid type: strin$"):
        compiler.matcher(broken)
    with pytest.raises(GrammarError, match="needs the model's end-of-sequence token ids"):
        GrammarCompiler(tokenizer(), ()).matcher(tool_call_grammar(TOOLS, "json"))
