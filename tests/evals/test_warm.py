"""The warm-start rules of ``evals/replay/warm.py``: FreeToken's first ``/metrics`` scrape, the
first turn's reuse for other servers (the 50% boundary), unknowns, and which rule decides when two
runs were judged differently."""

from __future__ import annotations

from evals.replay.scrape import engine_stats
from evals.replay.warm import first_turn_rule, metrics_rule, warm_mismatch, warm_start


def _turn(index: int = 0, prompt: int | None = 922, reused: int | None = 921,
          error: str | None = None) -> dict:
    return {"index": index, "prompt_tokens": prompt, "reused_tokens": reused, "error": error}


def test_metrics_rule_reads_requests_and_radix_tokens() -> None:
    fresh = engine_stats("freetoken_requests_added_total 0\nfreetoken_prefix_radix_tokens 0\n")
    assert metrics_rule(fresh) == (False, "/metrics at the first scrape: "
                                          "freetoken_requests_added_total 0, "
                                          "freetoken_prefix_radix_tokens 0")
    served = engine_stats("freetoken_requests_added_total 3\nfreetoken_prefix_radix_tokens 0\n")
    assert metrics_rule(served)[0] is True
    held = engine_stats("freetoken_prefix_radix_tokens 921\n")  # an older server: tree only
    assert metrics_rule(held) == (True, "/metrics at the first scrape: "
                                        "freetoken_prefix_radix_tokens 921")
    assert metrics_rule(engine_stats("freetoken_moe_hits_total 4\n")) is None
    assert metrics_rule(None) is None


def test_first_turn_rule_has_its_boundary_at_half_the_prompt() -> None:
    assert first_turn_rule([_turn(1, 10, 0), _turn(0)]) == (
        True, "first turn reused 921 of 922 prompt tokens (>= 50%)")
    assert first_turn_rule([_turn(prompt=100, reused=50)])[0] is True
    assert first_turn_rule([_turn(prompt=100, reused=49)]) == (
        False, "first turn reused 49 of 100 prompt tokens (< 50%)")
    for unknown in ([], [_turn(1)], [_turn(error="HTTP 500: x")], [_turn(reused=None)],
                    [_turn(prompt=None)], [_turn(prompt=0, reused=0)]):
        assert first_turn_rule(unknown) is None


def test_warm_start_prefers_the_metrics() -> None:
    scrape = engine_stats("freetoken_requests_added_total 0\n")
    assert warm_start(scrape, [_turn()]) == {
        "warm_start": False, "warm_start_rule": "metrics",
        "warm_start_evidence": "/metrics at the first scrape: freetoken_requests_added_total 0",
        "first_turn_warm": True}
    assert warm_start(None, [_turn(prompt=10, reused=0)]) == {
        "warm_start": False, "warm_start_rule": "first_turn_reuse",
        "warm_start_evidence": "first turn reused 0 of 10 prompt tokens (< 50%)",
        "first_turn_warm": False}
    assert warm_start(None, []) == {"warm_start": None, "warm_start_rule": None,
                                    "warm_start_evidence": None, "first_turn_warm": None}


def _s(warm: bool | None, rule: str | None, first: bool | None) -> dict:
    return {"warm_start": warm, "warm_start_rule": rule, "first_turn_warm": first}


def test_warm_mismatch_uses_the_rule_both_runs_have() -> None:
    cold_ft, warm_ft = _s(False, "metrics", False), _s(True, "metrics", True)
    assert warm_mismatch(warm_ft, cold_ft) == "warm start (run warm, baseline cold)"
    assert warm_mismatch(cold_ft, warm_ft) == "warm start (run cold, baseline warm)"
    assert warm_mismatch(cold_ft, cold_ft) is None
    # FreeToken warmed by one tiny request, a peer cold: same first-turn verdict, comparable
    warmed_up_ft = _s(True, "metrics", False)
    peer_cold = _s(False, "first_turn_reuse", False)
    assert warm_mismatch(peer_cold, warmed_up_ft) is None
    # FreeToken's second run (its first turn all cached) against a cold peer: not comparable
    assert warm_mismatch(peer_cold, warm_ft) == "warm start (run cold, baseline warm)"
    # unknowns and older summaries without the fields never withhold ratios
    assert warm_mismatch(_s(None, None, None), warm_ft) is None
    assert warm_mismatch({}, cold_ft) is None and warm_mismatch({}, {}) is None
    assert warm_mismatch(_s(True, "metrics", None), peer_cold) is None
