"""Grammar-constrained decoding in the engine, on the real tiny qwen3_next checkpoint.

With random weights the model never writes a tool call by itself (greedy decoding ends the turn
at once); under a forced ``tool_choice`` grammar it must write one whose arguments satisfy the
schema, and the requests batched with it must not notice.
"""

from __future__ import annotations

import pytest

from freetoken.constrain import GrammarError, tool_call_grammar
from freetoken.core import EngineInfo, GenerationRequest, SamplingParams
from freetoken.engine.engine import Engine
from freetoken.parsers import parse_output
from freetoken.parsers.events import TextDelta, ToolCallEvent
from tests.engine.constrained_schemas import TOOLS, check_call
from tests.engine.helpers import ENDOFTEXT, IM_END, ids_of, run_alone, text_of
from tests.prefix.engine_helpers import make_engine, tiny

JSON_ONE = tool_call_grammar(TOOLS, "json", parallel=False)
JSON_MANY = tool_call_grammar(TOOLS, "json")
NAMED = tool_call_grammar(TOOLS, "json", only="search")
SAMPLINGS = {
    "greedy": dict(temperature=0.0),
    "seeded": dict(temperature=1.0, seed=11),
    "nucleus": dict(temperature=0.8, top_p=0.9, top_k=50, seed=5),
}


def prompt(question: str = "What is the weather in Oslo?") -> tuple[int, ...]:
    _, _, tok, template = tiny("qwen3_next")
    text = template.render([{"role": "user", "content": question}], tools=TOOLS,
                           enable_thinking=False)
    return tuple(tok.encode(text))


def request(rid: str, grammar=None, max_tokens: int = 120, **sampling) -> GenerationRequest:
    return GenerationRequest(rid, prompt(), SamplingParams(max_tokens=max_tokens, grammar=grammar,
                                                           **sampling))


def calls_of(chunks) -> list[ToolCallEvent]:
    events = parse_output(text_of(chunks), TOOLS, in_reasoning=False)
    assert all(isinstance(e, ToolCallEvent) for e in events), events
    return events


def test_unconstrained_tiny_model_writes_no_call() -> None:
    chunks = run_alone(make_engine("qwen3_next"), request("r", temperature=0.0))
    assert ids_of(chunks) == [IM_END] and chunks[-1].finish_reason == "stop"


@pytest.mark.parametrize("name", SAMPLINGS)
@pytest.mark.parametrize("grammar", [JSON_ONE, NAMED], ids=["required", "named"])
def test_forced_call_is_one_valid_call_then_eos(name, grammar) -> None:
    chunks = run_alone(make_engine("qwen3_next"), request("r", grammar, **SAMPLINGS[name]))
    assert chunks[-1].finish_reason == "stop" and chunks[-1].stop_reason in (IM_END, ENDOFTEXT)
    (call,) = calls_of(chunks)
    check_call(call.name, call.arguments)
    if grammar is NAMED:
        assert call.name == "search"
    if name == "seeded":  # the seed reproduces the constrained draw
        again = run_alone(make_engine("qwen3_next"), request("r", grammar, **SAMPLINGS[name]))
        assert ids_of(again) == ids_of(chunks)


def test_parallel_calls_are_each_valid() -> None:
    chunks = run_alone(make_engine("qwen3_next"), request("r", JSON_MANY, max_tokens=150,
                                                          temperature=1.0, seed=3))
    events = parse_output(text_of(chunks), TOOLS, in_reasoning=False)
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert calls and events[: len(calls)] == calls  # calls only (a cut-off tail may follow)
    for call in calls:
        check_call(call.name, call.arguments)
    assert chunks[-1].finish_reason in ("stop", "length")


def test_mixed_batch_leaves_unconstrained_requests_unchanged() -> None:
    engine = make_engine("qwen3_next", budget=512)
    steps: list[set[int]] = []
    execute = engine.runner.execute
    engine.runner.execute = lambda batch: steps.append({e.request_key for e in batch.entries}) \
        or execute(batch)
    reqs = {
        0: request("free-greedy", None, max_tokens=20, temperature=0.0, ignore_eos=True),
        1: request("forced", JSON_ONE, temperature=1.0, seed=11),
        2: request("free-seeded", None, max_tokens=20, temperature=1.0, seed=4, ignore_eos=True),
        3: request("named", NAMED, temperature=0.0),
    }
    outs: dict[int, list] = {k: [] for k in reqs}
    for key, req in reqs.items():
        engine.add_request(key, req, outs[key].append)
    while engine.step():
        pass
    assert {0, 1, 2, 3} in steps  # decoded together
    for key, req in reqs.items():
        assert ids_of(outs[key]) == ids_of(run_alone(make_engine("qwen3_next"), req)), key
    assert [e.name for e in calls_of(outs[3])] == ["search"]
    assert engine.runner.constraints == {}


def test_call_cut_by_max_tokens_ends_with_length_and_no_call() -> None:
    chunks = run_alone(make_engine("qwen3_next"), request("r", JSON_ONE, max_tokens=12,
                                                          temperature=0.0))
    assert chunks[-1].finish_reason == "length" and len(ids_of(chunks)) == 12
    text = text_of(chunks)
    assert text.startswith('<tool_call>\n{"name": "')
    events = parse_output(text, TOOLS, in_reasoning=False)
    assert events and all(isinstance(e, TextDelta) for e in events)


def test_preempted_constrained_requests_still_match_running_alone() -> None:
    """A pool too small for three forced-call requests at once: requests are preempted and
    re-admitted mid-call, their matchers survive, and every output equals running alone."""
    model = tiny("qwen3_next")[1]
    page_bytes = model.kv_layout().bytes_per_token() * 16
    questions = ["Weather in Oslo?", "Zip code of Manchester, NH?", "Search deep for tags a."]
    reqs = [GenerationRequest(f"r{k}", prompt(q), SamplingParams(
        max_tokens=40, temperature=0.0, grammar=JSON_MANY)) for k, q in enumerate(questions)]
    engine = make_engine("qwen3_next", budget=1024, kv_cache_bytes=37 * page_bytes)
    assert engine.prefix.pool.num_pages == 37 and len(reqs[0].prompt_ids) > 500
    outs: dict[int, list] = {k: [] for k in range(3)}
    for k, req in enumerate(reqs):
        engine.add_request(k, req, outs[k].append)
    admissions = 0
    while engine.step():
        admissions = max([admissions, *(r.num_admissions for r in engine.scheduler.running)])
    assert admissions >= 2
    for k, req in enumerate(reqs):
        assert ids_of(outs[k]) == ids_of(run_alone(make_engine("qwen3_next"), req)), k
        calls = [e for e in parse_output(text_of(outs[k]), TOOLS, in_reasoning=False)
                 if isinstance(e, ToolCallEvent)]
        assert calls, k
        for call in calls:
            check_call(call.name, call.arguments)


class _Broken:
    """A matcher whose grammar fails when asked what may come next."""

    def allowed(self, *_args, **_kwargs):
        raise GrammarError("tool-call grammar failed: test")


def test_a_grammar_failure_ends_only_its_own_request() -> None:
    engine = make_engine("qwen3_next", budget=512)
    free = request("free", None, max_tokens=10, temperature=0.0, ignore_eos=True)
    outs: dict[int, list] = {0: [], 1: []}
    engine.add_request(0, request("forced", JSON_ONE, temperature=0.0), outs[0].append)
    engine.add_request(1, free, outs[1].append)
    engine.runner.constraints[0] = _Broken()
    while engine.step():
        pass
    last = outs[0][-1]
    assert (last.finish_reason, last.error) == ("error", "tool-call grammar failed: test")
    assert ids_of(outs[1]) == ids_of(run_alone(make_engine("qwen3_next"), free))
    assert engine.runner.constraints == {} and engine.runner.num_live_states == 0


def test_grammar_needs_eos_ids_and_a_grammar_object() -> None:
    path, model, tok, _ = tiny("qwen3_next")
    info = EngineInfo(str(path), "qwen3_next", 4096, model.config.vocab_size, ())
    with pytest.raises(ValueError, match="needs the model's end-of-sequence token ids"):
        Engine(model, tok, info).add_request(0, request("r", JSON_ONE), lambda _c: None)
    engine = make_engine("qwen3_next")
    with pytest.raises(ValueError, match="must be a ToolCallGrammar or a JsonAnswerGrammar, got str"):
        engine.add_request(0, request("r", "calls please"), lambda _c: None)
    assert engine.runner.constraints == {} and not engine.has_unfinished()
