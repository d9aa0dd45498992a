"""Engine statistics from FreeToken's ``GET /metrics`` (Prometheus text format 0.0.4, written by
``freetoken/server/metrics.py``), scraped before and after each turn.

An endpoint is treated as FreeToken when its ``/metrics`` has ``freetoken_`` families; any
other endpoint (a peer, a 404) gives None and the run records no engine columns.

Quantities (counters are summed over their labels, e.g. the per-layer MoE counters):

=====================  ============================================  =======
key                    family                                        kind
=====================  ============================================  =======
expert_hits            ``freetoken_moe_hits_total``                  counter
expert_misses          ``freetoken_moe_misses_total``                counter
checkpoint_saves       ``freetoken_prefix_checkpoint_saves_total``   counter
checkpoint_loads       ``freetoken_prefix_checkpoint_loads_total``   counter
checkpoint_evictions   ``freetoken_prefix_checkpoint_evictions_total``  counter
cached_tokens          ``freetoken_prompt_tokens_cached_total``      counter
computed_tokens        ``freetoken_prompt_tokens_recomputed_total``  counter
requests_added         ``freetoken_requests_added_total``            counter
checkpoints_device     ``freetoken_prefix_checkpoint_device_count``  gauge
checkpoints_host       ``freetoken_prefix_checkpoint_host_count``    gauge
radix_tokens           ``freetoken_prefix_radix_tokens``             gauge
=====================  ============================================  =======

Deltas of counters are after - before; gauges keep their value after. The MoE families exist
only with an offloaded backend (``--moe-backend offload|cpu|hybrid``, or ``auto`` when the
experts do not fit), so expert hits/misses are absent for a resident model. The first scrape of
a run (its raw values, not a delta) also tells whether the engine started warm
(:mod:`evals.replay.warm`: ``requests_added`` and ``radix_tokens`` > 0).
"""

from __future__ import annotations

import re

import httpx

COUNTERS = {
    "expert_hits": "freetoken_moe_hits_total",
    "expert_misses": "freetoken_moe_misses_total",
    "checkpoint_saves": "freetoken_prefix_checkpoint_saves_total",
    "checkpoint_loads": "freetoken_prefix_checkpoint_loads_total",
    "checkpoint_evictions": "freetoken_prefix_checkpoint_evictions_total",
    "cached_tokens": "freetoken_prompt_tokens_cached_total",
    "computed_tokens": "freetoken_prompt_tokens_recomputed_total",
    "requests_added": "freetoken_requests_added_total",
}
GAUGES = {
    "checkpoints_device": "freetoken_prefix_checkpoint_device_count",
    "checkpoints_host": "freetoken_prefix_checkpoint_host_count",
    "radix_tokens": "freetoken_prefix_radix_tokens",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Sum of every family's samples over their labels, by metric name (comments skipped,
    unparsable values ignored)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        out[match.group(1)] = out.get(match.group(1), 0.0) + value
    return out


def engine_stats(text: str) -> dict[str, float] | None:
    """The table's quantities from a ``/metrics`` page (whole numbers as ints), or None when it
    has no ``freetoken_`` family. Quantities whose family is absent are left out."""
    samples = parse_metrics(text)
    if not any(name.startswith("freetoken_") for name in samples):
        return None
    names = {**COUNTERS, **GAUGES}
    return {key: int(samples[name]) if samples[name].is_integer() else samples[name]
            for key, name in names.items() if name in samples}


def stats_delta(before: dict[str, float] | None, after: dict[str, float] | None
                ) -> dict[str, float] | None:
    """Counter deltas (after - before) and gauge values after; None when either is None."""
    if before is None or after is None:
        return None
    out = {k: after[k] - before[k] for k in COUNTERS if k in after and k in before}
    out.update({k: after[k] for k in GAUGES if k in after})
    return out


def hit_rate(stats: dict[str, float] | None) -> float | None:
    """Expert-cache hit rate hits / (hits + misses), None without MoE counters or lookups."""
    if not stats or "expert_hits" not in stats or "expert_misses" not in stats:
        return None
    total = stats["expert_hits"] + stats["expert_misses"]
    return stats["expert_hits"] / total if total else None


async def scrape(client: httpx.AsyncClient, base_url: str, hdrs: dict[str, str]
                 ) -> dict[str, float] | None:
    """``engine_stats`` of ``base_url/metrics``; None on any HTTP or transport error."""
    try:
        resp = await client.get(f"{base_url}/metrics", headers=hdrs)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return engine_stats(resp.text)
