"""The synchronous engine core with fake models: stops, holdback, UTF-8, lengths, errors."""

from __future__ import annotations

import logging
import math

import pytest

from freetoken.engine.engine import Engine
from freetoken.engine.validate import ContextLengthError

from tests.engine.fake_model import RecurrentLM, ScriptedLM
from tests.engine.helpers import IM_END, ids_of, info, request, run_alone, text_of, tokenizer

PROMPT = [11, 12, 13, 14, 15]


def _scripted(text_or_ids, *, filler_text: str = "z", **info_kw) -> tuple[Engine, list[int]]:
    tok = tokenizer()
    script = tok.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
    model = ScriptedLM(tok.vocab_size, len(PROMPT), script, tok.encode(filler_text)[0])
    return Engine(model, tok, info(**info_kw)), script


def test_stop_string_across_tokens_is_cut_and_never_streamed() -> None:
    engine, script = _scripted("The answer is 42.\nEND of story")
    assert "\nEND" not in [tokenizer().decode([t]) for t in script]  # spans several tokens
    chunks = run_alone(engine, request(PROMPT, stop=("\nEND",), max_tokens=50))
    assert text_of(chunks) == "The answer is 42."
    assert all("\n" not in c.text for c in chunks)  # the stop's first token was held back
    last = chunks[-1]
    assert (last.finish_reason, last.stop_reason) == ("stop", "\nEND")
    n = len(ids_of(chunks))
    assert tokenizer().decode(script[:n]).endswith("\nEND")
    assert last.completion_tokens == n and last.prompt_tokens == len(PROMPT)


def test_held_back_prefix_is_released_when_it_is_not_a_stop() -> None:
    engine, script = _scripted("a <b> <c> done", filler_text="!")
    chunks = run_alone(engine, request(PROMPT, stop=("<c>x",), max_tokens=len(script)))
    assert text_of(chunks) == "a <b> <c> done"
    assert chunks[-1].finish_reason == "length" and chunks[-1].stop_reason is None


def test_stop_string_pending_at_length_finish_is_flushed() -> None:
    engine, script = _scripted("hello wor", filler_text="!")
    chunks = run_alone(engine, request(PROMPT, stop=("world",), max_tokens=len(script)))
    assert text_of(chunks) == "hello wor"
    assert chunks[-1].finish_reason == "length"


def test_eos_stops_and_is_not_in_the_text() -> None:
    tok = tokenizer()
    engine, script = _scripted([*tok.encode("Hi there"), IM_END, *tok.encode(" more")])
    chunks = run_alone(engine, request(PROMPT, max_tokens=50))
    assert text_of(chunks) == "Hi there"
    assert ids_of(chunks)[-1] == IM_END and chunks[-1].completion_tokens == len(tok.encode("Hi there")) + 1
    assert (chunks[-1].finish_reason, chunks[-1].stop_reason) == ("stop", IM_END)


def test_ignore_eos_generates_to_max_tokens_without_eos_text() -> None:
    tok = tokenizer()
    engine, script = _scripted([*tok.encode("Hi"), IM_END, *tok.encode(" more")])
    chunks = run_alone(engine, request(PROMPT, max_tokens=len(script), ignore_eos=True))
    assert text_of(chunks) == "Hi more"  # the special EOS token is generated but not shown
    assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == len(script)


def test_stop_token_ids_apply_even_with_ignore_eos() -> None:
    tok = tokenizer()
    stop_id = tok.encode(",")[0]
    engine, _ = _scripted("one, two")
    chunks = run_alone(engine, request(PROMPT, stop_token_ids=(stop_id,), ignore_eos=True))
    assert text_of(chunks) == "one"
    assert (chunks[-1].finish_reason, chunks[-1].stop_reason) == ("stop", stop_id)


def test_max_tokens_gives_length() -> None:
    engine, script = _scripted("a b c d e f g h")
    chunks = run_alone(engine, request(PROMPT, max_tokens=3))
    assert ids_of(chunks) == script[:3] and len(chunks) == 3
    assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == 3
    assert [c.finish_reason for c in chunks[:-1]] == [None, None]


def test_max_model_len_caps_generation_with_length() -> None:
    engine, script = _scripted("a b c d e f g h", max_model_len=len(PROMPT) + 2)
    chunks = run_alone(engine, request(PROMPT, max_tokens=100))
    assert ids_of(chunks) == script[:2] and chunks[-1].finish_reason == "length"


def test_utf8_split_tokens_stream_whole_characters() -> None:
    text = "ok 😀🎉 中文字 ✓"
    engine, script = _scripted(text)
    chunks = run_alone(engine, request(PROMPT, max_tokens=len(script)))
    assert all("\ufffd" not in c.text for c in chunks)
    assert text_of(chunks) == text
    assert sum(c.text == "" for c in chunks) >= 3  # bytes of split characters were held


def test_special_tokens_stay_in_text() -> None:
    engine, script = _scripted("<think>hmm</think><tool_call>{}</tool_call>")
    assert 8216 in script and 8206 in script
    chunks = run_alone(engine, request(PROMPT, max_tokens=len(script)))
    assert text_of(chunks) == "<think>hmm</think><tool_call>{}</tool_call>"


def test_logprobs_have_exact_values_and_token_strings() -> None:
    engine, script = _scripted("Hi there")
    chunks = run_alone(engine, request(PROMPT, max_tokens=2, logprobs=2))
    v = tokenizer().vocab_size
    expected = 10.0 - math.log(math.exp(10.0) + (v - 1))
    lps = [lp for c in chunks for lp in c.logprobs]
    assert [lp.token_id for lp in lps] == script[:2]
    assert [lp.token for lp in lps] == [tokenizer().decode([t]) for t in script[:2]]
    for lp in lps:
        assert lp.logprob == pytest.approx(expected, abs=1e-4)  # float32 sum over V
        assert lp.top[0][0] == lp.token_id and len(lp.top) == 2
        assert lp.top[1][2] == pytest.approx(-math.log(math.exp(10.0) + (v - 1)), abs=1e-4)
    assert run_alone(engine, request(PROMPT, max_tokens=1), key=1)[0].logprobs is None


def test_chunked_prefill_gives_the_same_output_as_one_shot() -> None:
    tok = tokenizer()
    prompt = [(i * 37) % 8000 for i in range(300)]
    outs = []
    for budget in (64, 4096):
        model = RecurrentLM(tok.vocab_size, seed=1)
        engine = Engine(model, tok, info(eos=()), max_num_batched_tokens=budget)
        outs.append(ids_of(run_alone(engine, request(prompt, max_tokens=8))))
        sizes = [t for _, _, t in model.calls]
        assert sizes == ([64] * 4 + [44] if budget == 64 else [300]) + [1] * 7
    assert outs[0] == outs[1] and len(set(outs[0])) > 1


def test_seeded_sampling_reproduces_through_the_engine() -> None:
    tok = tokenizer()
    engine = Engine(RecurrentLM(tok.vocab_size, seed=2), tok, info(eos=()))
    runs = [ids_of(run_alone(engine, request(PROMPT, temperature=1.0, seed=s, max_tokens=12), key=k))
            for k, s in enumerate((5, 5, 6))]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_model_error_finishes_with_error_and_engine_keeps_serving() -> None:
    tok = tokenizer()
    model = RecurrentLM(tok.vocab_size, fail_on_token=999)
    engine = Engine(model, tok, info(eos=()))
    bad = run_alone(engine, request([1, 999, 3], rid="bad"), key=0)
    assert len(bad) == 1 and bad[0].finish_reason == "error"
    assert bad[0].error == "RuntimeError: injected failure on token 999"
    assert engine.runner.num_live_states == 0
    good = run_alone(engine, request([1, 2, 3], rid="good", max_tokens=4), key=1)
    assert good[-1].finish_reason == "length" and len(ids_of(good)) == 4


def test_abort_waiting_and_running_requests() -> None:
    tok = tokenizer()
    engine = Engine(RecurrentLM(tok.vocab_size), tok, info(eos=()))
    a, b = [], []
    engine.add_request(0, request([1, 2], rid="a", max_tokens=100), a.append)
    engine.add_request(1, request([3, 4], rid="b", max_tokens=100), b.append)
    assert engine.abort_request(1)  # still waiting
    assert [c.finish_reason for c in b] == ["abort"] and b[0].token_ids == ()
    for _ in range(3):
        engine.step()
    assert engine.abort_request(0)  # running
    assert a[-1].finish_reason == "abort" and len(ids_of(a)) == 3
    assert not engine.has_unfinished() and engine.runner.num_live_states == 0
    assert not engine.abort_request(0)


def test_finish_log_line(caplog: pytest.LogCaptureFixture) -> None:
    engine, _ = _scripted("a b c d")
    with caplog.at_level(logging.INFO, logger="freetoken.engine"):
        run_alone(engine, request(PROMPT, rid="req-7", max_tokens=3))
    lines = [r.getMessage() for r in caplog.records if r.name == "freetoken.engine"]
    assert len(lines) == 1
    assert lines[0].startswith(
        "request req-7 finished (length): prompt 5 tokens (reused 0, recomputed 5), generated 3 "
        "tokens, TTFT "
    )
    assert lines[0].endswith(" tok/s")
    from tests.clients.server import FINISHED_LINE  # the real-client runner parses this line

    match = FINISHED_LINE.search(lines[0])
    assert match is not None and (match["id"], match["prompt"], match["generated"]) == (
        "req-7", "5", "3")


def test_validation_errors_are_clear() -> None:
    engine, _ = _scripted("x", max_model_len=8)
    sink = [].append
    with pytest.raises(ContextLengthError, match="^The prompt is empty"):
        engine.add_request(0, request([]), sink)
    with pytest.raises(ContextLengthError) as exc:
        engine.add_request(0, request(list(range(8))), sink)
    assert str(exc.value) == (
        "This model's maximum context length is 8 tokens, but the prompt has 8 tokens and at "
        "least 1 token must be left for the output. Please reduce the length of the prompt."
    )
    engine.add_request(0, request(list(range(7))), sink)  # 7 + 1 fits exactly
    cases = [
        (dict(), [1, 9000], "prompt token id 9000 at position 1 is outside the vocabulary [0, 8218)"),
        (dict(max_tokens=0), [1], "max_tokens must be >= 1, got 0"),
        (dict(temperature=-1.0), [1], "temperature must be a finite number >= 0, got -1.0"),
        (dict(top_p=0.0), [1], "top_p must be in (0, 1], got 0.0"),
        (dict(top_k=-2), [1], "top_k must be >= 0 (0 disables it), got -2"),
        (dict(logprobs=-1), [1], "logprobs must be >= 0, got -1"),
        (dict(stop=("",)), [1], "stop strings must be non-empty strings, got ['']"),
        (dict(stop_token_ids=(-1,)), [1], "stop token id -1 is outside the vocabulary [0, 8218)"),
    ]
    for kw, prompt, message in cases:
        with pytest.raises(ValueError) as exc:
            engine.add_request(1, request(prompt, **kw), sink)
        assert str(exc.value) == message


def test_padded_vocabulary_rows_are_never_sampled() -> None:
    # The checkpoint's vocab_size rounds the tokenizer size up; those extra ids decode to
    # nothing, so the runner must never pick them even when the model favours one.
    tok = tokenizer()
    padded = tok.vocab_size + 20
    model = ScriptedLM(tok.vocab_size + 38, len(PROMPT), [padded, padded], tok.encode("z")[0])
    engine = Engine(model, tok, info())
    chunks = run_alone(engine, request(PROMPT, max_tokens=2, temperature=0, logprobs=1))
    assert all(t < tok.vocab_size for t in ids_of(chunks))
    lps = [lp for c in chunks for lp in (c.logprobs or ())]
    assert len(lps) == 2 and all(alt[0] < tok.vocab_size for lp in lps for alt in lp.top)
