"""Did the endpoint start the run warm? A server that already served requests (a previous run of
the same workload, above all) answers from its prefix cache: turn 0 of a second W2 run against the
same FreeToken server reused 921 of its 922 prompt tokens, and its TTFT looked 6x faster. Such a
run is not a cold-start measurement, and ratios against a cold run mislead.

Two rules, recorded in ``summary.json`` as ``warm_start`` (true / false / null = unknown),
``warm_start_rule`` and ``warm_start_evidence`` (which rule fired, with its numbers):

* ``"metrics"`` (FreeToken: its ``/metrics`` has ``freetoken_`` families): warm when, at the
  first scrape (before the first request of the run), the engine had already accepted requests
  (``freetoken_requests_added_total`` > 0) or its radix tree held prompt tokens
  (``freetoken_prefix_radix_tokens`` > 0); families from ``freetoken/server/metrics.py`` and
  ``freetoken/prefix/manager.py`` (``stats``). When neither family is exposed, the next rule.
* ``"first_turn_reuse"`` (any endpoint that reports reused prompt tokens): warm when the run's
  first turn (plan order) reports reused / cached prompt tokens >= :data:`WARM_REUSE_FRACTION`
  of its prompt. Unknown (null) when that turn failed, did not finish, or reports no counts.

The first-turn rule is also evaluated for FreeToken runs (``first_turn_warm``), so that two runs
judged by different rules (FreeToken against a peer) are compared on the rule both have
(:func:`warm_mismatch`).
"""

from __future__ import annotations

WARM_REUSE_FRACTION = 0.5
WARM_LINE = ("WARM: the server had already served requests before this run; its TTFT/reuse are "
             "not a cold-start measurement")
_METRIC_NAMES = {"requests_added": "freetoken_requests_added_total",
                 "radix_tokens": "freetoken_prefix_radix_tokens"}


def metrics_rule(first_scrape: dict | None) -> tuple[bool, str] | None:
    """``(warm, evidence)`` from the first ``/metrics`` scrape (``scrape.engine_stats`` keys
    ``requests_added`` and ``radix_tokens``), None when the scrape is None or has neither."""
    if not first_scrape:
        return None
    seen = [(key, first_scrape[key]) for key in _METRIC_NAMES if key in first_scrape]
    if not seen:
        return None
    text = ", ".join(f"{_METRIC_NAMES[k]} {_int(v)}" for k, v in seen)
    warm = any(v > 0 for _, v in seen)
    return warm, f"/metrics at the first scrape: {text}"


def first_turn_rule(records: list[dict]) -> tuple[bool, str] | None:
    """``(warm, evidence)`` from the turn of index 0 (reused >= half of its prompt tokens), None
    when that turn is missing, failed, or reports no prompt / reused tokens."""
    first = next((r for r in records if r.get("index") == 0), None)
    if first is None or first.get("error") is not None:
        return None
    prompt, reused = first.get("prompt_tokens"), first.get("reused_tokens")
    if not prompt or reused is None:
        return None
    warm = reused >= WARM_REUSE_FRACTION * prompt
    sign = ">=" if warm else "<"
    return warm, (f"first turn reused {reused} of {prompt} prompt tokens ({sign} "
                  f"{WARM_REUSE_FRACTION:.0%})")


def _int(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def warm_start(first_scrape: dict | None, records: list[dict]) -> dict:
    """The summary fields ``warm_start``, ``warm_start_rule``, ``warm_start_evidence`` and
    ``first_turn_warm`` (module docstring); all None when nothing tells."""
    by_turn = first_turn_rule(records)
    by_metrics = metrics_rule(first_scrape)
    rule, found = ("metrics", by_metrics) if by_metrics else ("first_turn_reuse", by_turn)
    if found is None:
        return {"warm_start": None, "warm_start_rule": None, "warm_start_evidence": None,
                "first_turn_warm": None}
    return {"warm_start": found[0], "warm_start_rule": rule, "warm_start_evidence": found[1],
            "first_turn_warm": by_turn[0] if by_turn else None}


def warm_mismatch(run: dict, base: dict) -> str | None:
    """The ``not comparable`` reason when one of two summaries started warm and the other cold,
    else None (also when either is unknown, e.g. an older summary without the fields).

    Both judged by the same rule: their ``warm_start``. By different rules (FreeToken's metrics
    against a peer's first turn): their ``first_turn_warm``, the rule both can evaluate.
    """
    a, b = run.get("warm_start"), base.get("warm_start")
    rule_a, rule_b = run.get("warm_start_rule"), base.get("warm_start_rule")
    if rule_a and rule_b and rule_a != rule_b:
        a, b = run.get("first_turn_warm"), base.get("first_turn_warm")
    if a is None or b is None or a == b:
        return None
    return f"warm start (run {'warm' if a else 'cold'}, baseline {'warm' if b else 'cold'})"
