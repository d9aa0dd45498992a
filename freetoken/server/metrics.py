"""``GET /metrics`` in the Prometheus text exposition format (version 0.0.4), without a client
library: engine counters and latency histograms, and the offloaded MoE runtime's cache gauges and
per-layer counters.

Every family is written as ``# HELP``, ``# TYPE`` and its samples; families without samples
(a bandwidth that was never profiled) are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from freetoken.engine.counters import FINISH_REASONS, EngineCounters
from freetoken.offload.control import LayerStats, MoeStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Sample = tuple[dict[str, str], float | int | bool]

# (metric suffix, LayerStats attribute, help text) of the per-layer counters.
_LAYER_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("hits_total", "hits", "Routed experts found in the device expert cache."),
    ("misses_total", "misses", "Routed experts not in the device expert cache."),
    ("fills_total", "fills", "Misses copied into the device expert cache."),
    ("cpu_experts_total", "cpu_experts", "Misses run on the CPU from the host banks."),
    ("evictions_total", "evictions", "Cache fills that replaced a resident expert."),
    ("q_total", "q_sum", "Sum over forward calls of q chosen by the miss split."),
    ("steps_total", "steps", "Forward calls of the MoE layer."),
    ("device_seconds_total", "device_s", "Seconds spent in the device branch."),
    ("cpu_seconds_total", "cpu_s", "Seconds the CPU expert kernel ran."),
)


def _escape(value: str) -> str:
    """A label value with ``\\``, ``"`` and newlines escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float | int | bool) -> str:
    """Sample value text: bools as 0/1, ints exact, floats in shortest round-trip form."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value)).replace("inf", "Inf").replace("nan", "NaN")


def family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    """The lines of one metric family (empty when it has no samples).

    Args:
        name: metric name (``_total`` suffix included for counters).
        kind: ``counter`` or ``gauge``.
        help_text: one-line description.
        samples: ``(labels, value)`` pairs; labels are rendered in insertion order.
    """
    rows = []
    for labels, value in samples:
        label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        rows.append(f"{name}{{{label_text}}} {_number(value)}" if label_text
                    else f"{name} {_number(value)}")
    if not rows:
        return []
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *rows]


def _healthy_lines(healthy: bool) -> list[str]:
    return family("freetoken_engine_healthy", "gauge", "1 while the engine loop is alive.",
                  [({}, healthy)])


def _engine_lines(counters: EngineCounters, healthy: bool) -> list[str]:
    reasons = [*FINISH_REASONS, *(r for r in counters.finished if r not in FINISH_REASONS)]
    finished = [({"reason": r}, counters.finished.get(r, 0)) for r in reasons]
    return [
        *_healthy_lines(healthy),
        *family("freetoken_requests_added_total", "counter", "Requests accepted by the engine.",
                [({}, counters.requests_added)]),
        *family("freetoken_requests_finished_total", "counter",
                "Requests finished, by finish reason.", finished),
        *family("freetoken_prompt_tokens_total", "counter",
                "Prompt tokens of the requests that started, counted whole at each request's "
                "first step (cached plus to compute).", [({}, counters.prompt_tokens)]),
        *family("freetoken_prompt_tokens_recomputed_total", "counter",
                "Prompt tokens run through the model (not reused from the prefix cache; "
                "recomputation after a preemption counts again).",
                [({}, counters.prompt_tokens_recomputed)]),
        *family("freetoken_generation_tokens_total", "counter", "Tokens sampled.",
                [({}, counters.generation_tokens)]),
        *family("freetoken_requests_running", "gauge", "Requests being computed.",
                [({}, counters.running)]),
        *family("freetoken_requests_waiting", "gauge", "Requests queued.",
                [({}, counters.waiting)]),
        *family("freetoken_prompt_tokens_cached_total", "counter",
                "Prompt tokens reused from the prefix cache (radix tree + checkpoints).",
                [({}, counters.cached_tokens)]),
        *_prefix_lines(counters.prefix),
        *counters.time_to_first_token.render(
            "freetoken_time_to_first_token_seconds",
            "Seconds from a request's arrival in the engine to its first sampled token."),
        *counters.inter_token_latency.render(
            "freetoken_inter_token_latency_seconds",
            "Seconds between consecutive sampled tokens of a request (one per token after the "
            "first)."),
        *counters.queue_time.render(
            "freetoken_request_queue_time_seconds",
            "Seconds from a request's arrival in the engine to the start of its first step."),
        *counters.prefill_throughput.render(
            "freetoken_prefill_tokens_per_second",
            "Prefill speed per request in tokens/s: prompt tokens run through the model over the "
            "seconds from its first step's start to its first sampled token."),
    ]


_PREFIX_COUNTERS = ("saves", "loads", "spills", "drops", "evictions")


def _prefix_lines(stats: dict[str, int]) -> list[str]:
    """``freetoken_prefix_*`` families from ``PrefixCache.stats()`` (cumulative checkpoint
    operations as counters, the rest as gauges)."""
    lines: list[str] = []
    for key, value in sorted(stats.items()):
        counter = key.endswith(_PREFIX_COUNTERS)
        name = f"freetoken_prefix_{key}" + ("_total" if counter else "")
        lines += family(name, "counter" if counter else "gauge",
                        f"Prefix cache: {key.replace('_', ' ')}.", [({}, value)])
    return lines


def _layer_samples(layers: tuple[LayerStats, ...], attr: str) -> list[Sample]:
    return [({"layer": str(s.layer)}, getattr(s, attr)) for s in layers]


def _moe_lines(stats: MoeStats) -> list[str]:
    info = {"backend": stats.backend, "policy": stats.policy, "device": stats.device,
            "expert_format": stats.expert_format, "cpu_activations": stats.cpu_activations}
    bandwidth = [({"link": link}, gbps) for link, gbps in
                 (("p", stats.bandwidth_p_gbps), ("h", stats.bandwidth_h_gbps)) if gbps is not None]
    pending = [] if stats.pending_resize_bytes is None else [({}, stats.pending_resize_bytes)]
    floor = [] if stats.memory_floor_bytes is None else [({}, stats.memory_floor_bytes)]
    lines = [
        *family("freetoken_moe_info", "gauge", "Offloaded MoE runtime configuration.",
                [(info, 1)]),
        *family("freetoken_moe_cache_slots", "gauge", "Expert slots in the device cache.",
                [({}, stats.num_slots)]),
        *family("freetoken_moe_cache_bytes", "gauge", "Bytes of the device expert cache.",
                [({}, stats.cache_bytes)]),
        *family("freetoken_moe_slot_bytes", "gauge", "Bytes of one expert slot.",
                [({}, stats.slot_bytes)]),
        *family("freetoken_moe_total_experts", "gauge", "Routed experts in the host banks.",
                [({}, stats.total_experts)]),
        *family("freetoken_moe_bank_bytes", "gauge", "Bytes of all host expert banks.",
                [({}, stats.bank_bytes)]),
        *family("freetoken_moe_banks_pinned", "gauge", "1 when the host banks are page-locked.",
                [({}, stats.banks_pinned)]),
        *family("freetoken_moe_split_ratio", "gauge", "Moving average of the fraction of cache misses filled (q/m).",
                [({}, stats.split_ratio)]),
        *family("freetoken_moe_bandwidth_gbps", "gauge",
                "Profiled bandwidths of the miss split in GB/s (link=p: B_P, link=h: B_H).",
                bandwidth),
        *family("freetoken_moe_pending_resize_bytes", "gauge",
                "Expert cache size waiting for the next step boundary.", pending),
        *family("freetoken_moe_memory_floor_bytes", "gauge",
                "Free device bytes the memory watcher keeps (--moe-memory-floor).", floor),
        *family("freetoken_moe_watcher_resizes_total", "counter",
                "Expert cache resizes by the memory watcher.",
                [] if stats.memory_floor_bytes is None else
                [({"direction": "shrink"}, stats.watcher_shrinks),
                 ({"direction": "grow"}, stats.watcher_grows)]),
    ]
    for suffix, attr, help_text in _LAYER_COUNTERS:
        lines += family(f"freetoken_moe_{suffix}", "counter", help_text,
                        _layer_samples(stats.layers, attr))
    return lines


def _harness_lines(totals: Mapping[str, Any], live: Mapping[str, int]) -> list[str]:
    """Per-harness families (labels ``harness``): requests and prompt tokens reused/recomputed
    (counters, see ``SessionStore.metrics``) and live sessions (gauge)."""
    names = sorted(totals)
    lines = []
    for suffix, attr, text in (
        ("requests_total", "requests", "Finished chat requests served by each harness adapter."),
        ("prompt_tokens_reused_total", "reused_tokens",
         "Prompt tokens of each harness's requests served from the prefix cache."),
        ("prompt_tokens_recomputed_total", "recomputed_tokens",
         "Prompt tokens of each harness's requests prefilled (not found in the prefix cache)."),
    ):
        lines += family(f"freetoken_harness_{suffix}", "counter", text,
                        [({"harness": n}, getattr(totals[n], attr)) for n in names])
    lines += family("freetoken_sessions", "gauge", "Live harness sessions (explicit and detected).",
                    [({"harness": n}, live[n]) for n in sorted(live)])
    return lines


def render_metrics(counters: EngineCounters, moe_stats: MoeStats | None, *,
                   healthy: bool = True, sessions: tuple[Mapping[str, Any], Mapping[str, int]] | None = None
                   ) -> str:
    """The ``/metrics`` page: engine families, then the MoE families when ``moe_stats`` is given.

    Args:
        counters: the engine's counters.
        moe_stats: the offload runtime's snapshot, or None (resident backend, or the engine is
            dead so no consistent snapshot could be taken).
        healthy: value of ``freetoken_engine_healthy``.
        sessions: ``SessionStore.metrics()`` (per-harness totals, live sessions), or None.

    Returns:
        The exposition text, one sample per line, ending with a newline.
    """
    lines = _engine_lines(counters, healthy)
    if sessions is not None:
        lines += _harness_lines(*sessions)
    if moe_stats is not None:
        lines += _moe_lines(moe_stats)
    return "\n".join(lines) + "\n"


def render_loading_metrics(stage: str, fraction: float | None, elapsed_s: float) -> str:
    """The ``/metrics`` page while the model loads (a scraper sees the server up, not a 503):
    ``freetoken_engine_healthy`` 0, ``freetoken_loading`` 1, the stage as a label, the share
    of checkpoint bytes read (omitted while unknown) and the seconds since the load started."""
    lines = [
        *_healthy_lines(False),
        *family("freetoken_loading", "gauge", "1 while the model loads (per stage).",
                [({"stage": stage}, True)]),
        *family("freetoken_loading_seconds", "gauge", "Seconds since the model load started.",
                [({}, elapsed_s)]),
    ]
    if fraction is not None:
        lines += family("freetoken_loading_fraction", "gauge",
                        "Share of the checkpoint bytes read so far (0-1).", [({}, fraction)])
    return "\n".join(lines) + "\n"
