"""``/metrics``: the exact Prometheus text of ``render_metrics``, and the route (content type,
api key, the MoE snapshot taken between steps, a dead loop)."""

from __future__ import annotations

from freetoken.engine.counters import (INTER_TOKEN_BUCKETS_S, PREFILL_BUCKETS_TOK_S,
                                       QUEUE_BUCKETS_S, TTFT_BUCKETS_S, EngineCounters)
from freetoken.engine.histogram import Histogram, HistogramSnapshot
from freetoken.offload.control import LayerStats
from freetoken.server.metrics import render_metrics

from tests.server.srv_moe import MIB, FakeMoe


def _observed(bounds: tuple[float, ...], *values: float) -> HistogramSnapshot:
    hist = Histogram(bounds)
    for value in values:
        hist.observe(value)
    return hist.snapshot()


COUNTERS = EngineCounters(
    requests_added=7,
    finished={"stop": 3, "length": 2, "abort": 1, "error": 0},
    prompt_tokens=1234,
    prompt_tokens_recomputed=734,
    generation_tokens=99,
    running=1,
    waiting=0,
    cached_tokens=500,
    prefix={"kv_pages_free": 10, "checkpoint_saves": 4},
    time_to_first_token=_observed(TTFT_BUCKETS_S, 0.0625, 0.375, 3.0),
    inter_token_latency=_observed(INTER_TOKEN_BUCKETS_S, 0.03125, 0.03125, 0.125),
    queue_time=_observed(QUEUE_BUCKETS_S, 0.0009765625, 0.75, 200.0),
    prefill_throughput=_observed(PREFILL_BUCKETS_TOK_S, 1500.0, 40000.0),
)
LAYERS = (
    LayerStats(0, steps=10, hits=40, misses=20, fills=15, cpu_experts=5, evictions=3, q_sum=12,
               device_s=0.25, cpu_s=1.5),
    LayerStats(1, steps=10, hits=55, misses=5, fills=5, cpu_experts=0, evictions=0, q_sum=0,
               device_s=0.125, cpu_s=0.0),
)

ENGINE_TEXT = """\
# HELP freetoken_engine_healthy 1 while the engine loop is alive.
# TYPE freetoken_engine_healthy gauge
freetoken_engine_healthy 1
# HELP freetoken_requests_added_total Requests accepted by the engine.
# TYPE freetoken_requests_added_total counter
freetoken_requests_added_total 7
# HELP freetoken_requests_finished_total Requests finished, by finish reason.
# TYPE freetoken_requests_finished_total counter
freetoken_requests_finished_total{reason="stop"} 3
freetoken_requests_finished_total{reason="length"} 2
freetoken_requests_finished_total{reason="abort"} 1
freetoken_requests_finished_total{reason="error"} 0
# HELP freetoken_prompt_tokens_total Prompt tokens of the requests that started, counted whole at each request's first step (cached plus to compute).
# TYPE freetoken_prompt_tokens_total counter
freetoken_prompt_tokens_total 1234
# HELP freetoken_prompt_tokens_recomputed_total Prompt tokens run through the model (not reused from the prefix cache; recomputation after a preemption counts again).
# TYPE freetoken_prompt_tokens_recomputed_total counter
freetoken_prompt_tokens_recomputed_total 734
# HELP freetoken_generation_tokens_total Tokens sampled.
# TYPE freetoken_generation_tokens_total counter
freetoken_generation_tokens_total 99
# HELP freetoken_requests_running Requests being computed.
# TYPE freetoken_requests_running gauge
freetoken_requests_running 1
# HELP freetoken_requests_waiting Requests queued.
# TYPE freetoken_requests_waiting gauge
freetoken_requests_waiting 0
# HELP freetoken_prompt_tokens_cached_total Prompt tokens reused from the prefix cache (radix tree + checkpoints).
# TYPE freetoken_prompt_tokens_cached_total counter
freetoken_prompt_tokens_cached_total 500
# HELP freetoken_prefix_checkpoint_saves_total Prefix cache: checkpoint saves.
# TYPE freetoken_prefix_checkpoint_saves_total counter
freetoken_prefix_checkpoint_saves_total 4
# HELP freetoken_prefix_kv_pages_free Prefix cache: kv pages free.
# TYPE freetoken_prefix_kv_pages_free gauge
freetoken_prefix_kv_pages_free 10
# HELP freetoken_time_to_first_token_seconds Seconds from a request's arrival in the engine to its first sampled token.
# TYPE freetoken_time_to_first_token_seconds histogram
freetoken_time_to_first_token_seconds_bucket{le="0.025"} 0
freetoken_time_to_first_token_seconds_bucket{le="0.05"} 0
freetoken_time_to_first_token_seconds_bucket{le="0.1"} 1
freetoken_time_to_first_token_seconds_bucket{le="0.25"} 1
freetoken_time_to_first_token_seconds_bucket{le="0.5"} 2
freetoken_time_to_first_token_seconds_bucket{le="1.0"} 2
freetoken_time_to_first_token_seconds_bucket{le="2.5"} 2
freetoken_time_to_first_token_seconds_bucket{le="5.0"} 3
freetoken_time_to_first_token_seconds_bucket{le="10.0"} 3
freetoken_time_to_first_token_seconds_bucket{le="20.0"} 3
freetoken_time_to_first_token_seconds_bucket{le="40.0"} 3
freetoken_time_to_first_token_seconds_bucket{le="80.0"} 3
freetoken_time_to_first_token_seconds_bucket{le="120.0"} 3
freetoken_time_to_first_token_seconds_bucket{le="+Inf"} 3
freetoken_time_to_first_token_seconds_sum 3.4375
freetoken_time_to_first_token_seconds_count 3
# HELP freetoken_inter_token_latency_seconds Seconds between consecutive sampled tokens of a request (one per token after the first).
# TYPE freetoken_inter_token_latency_seconds histogram
freetoken_inter_token_latency_seconds_bucket{le="0.005"} 0
freetoken_inter_token_latency_seconds_bucket{le="0.01"} 0
freetoken_inter_token_latency_seconds_bucket{le="0.02"} 0
freetoken_inter_token_latency_seconds_bucket{le="0.035"} 2
freetoken_inter_token_latency_seconds_bucket{le="0.05"} 2
freetoken_inter_token_latency_seconds_bucket{le="0.075"} 2
freetoken_inter_token_latency_seconds_bucket{le="0.1"} 2
freetoken_inter_token_latency_seconds_bucket{le="0.15"} 3
freetoken_inter_token_latency_seconds_bucket{le="0.25"} 3
freetoken_inter_token_latency_seconds_bucket{le="0.5"} 3
freetoken_inter_token_latency_seconds_bucket{le="1.0"} 3
freetoken_inter_token_latency_seconds_bucket{le="2.5"} 3
freetoken_inter_token_latency_seconds_bucket{le="5.0"} 3
freetoken_inter_token_latency_seconds_bucket{le="10.0"} 3
freetoken_inter_token_latency_seconds_bucket{le="+Inf"} 3
freetoken_inter_token_latency_seconds_sum 0.1875
freetoken_inter_token_latency_seconds_count 3
# HELP freetoken_request_queue_time_seconds Seconds from a request's arrival in the engine to the start of its first step.
# TYPE freetoken_request_queue_time_seconds histogram
freetoken_request_queue_time_seconds_bucket{le="0.001"} 1
freetoken_request_queue_time_seconds_bucket{le="0.0025"} 1
freetoken_request_queue_time_seconds_bucket{le="0.005"} 1
freetoken_request_queue_time_seconds_bucket{le="0.01"} 1
freetoken_request_queue_time_seconds_bucket{le="0.025"} 1
freetoken_request_queue_time_seconds_bucket{le="0.05"} 1
freetoken_request_queue_time_seconds_bucket{le="0.1"} 1
freetoken_request_queue_time_seconds_bucket{le="0.25"} 1
freetoken_request_queue_time_seconds_bucket{le="0.5"} 1
freetoken_request_queue_time_seconds_bucket{le="1.0"} 2
freetoken_request_queue_time_seconds_bucket{le="2.5"} 2
freetoken_request_queue_time_seconds_bucket{le="5.0"} 2
freetoken_request_queue_time_seconds_bucket{le="10.0"} 2
freetoken_request_queue_time_seconds_bucket{le="30.0"} 2
freetoken_request_queue_time_seconds_bucket{le="60.0"} 2
freetoken_request_queue_time_seconds_bucket{le="120.0"} 2
freetoken_request_queue_time_seconds_bucket{le="+Inf"} 3
freetoken_request_queue_time_seconds_sum 200.7509765625
freetoken_request_queue_time_seconds_count 3
# HELP freetoken_prefill_tokens_per_second Prefill speed per request in tokens/s: prompt tokens run through the model over the seconds from its first step's start to its first sampled token.
# TYPE freetoken_prefill_tokens_per_second histogram
freetoken_prefill_tokens_per_second_bucket{le="10.0"} 0
freetoken_prefill_tokens_per_second_bucket{le="25.0"} 0
freetoken_prefill_tokens_per_second_bucket{le="50.0"} 0
freetoken_prefill_tokens_per_second_bucket{le="100.0"} 0
freetoken_prefill_tokens_per_second_bucket{le="250.0"} 0
freetoken_prefill_tokens_per_second_bucket{le="500.0"} 0
freetoken_prefill_tokens_per_second_bucket{le="1000.0"} 0
freetoken_prefill_tokens_per_second_bucket{le="2500.0"} 1
freetoken_prefill_tokens_per_second_bucket{le="5000.0"} 1
freetoken_prefill_tokens_per_second_bucket{le="10000.0"} 1
freetoken_prefill_tokens_per_second_bucket{le="25000.0"} 1
freetoken_prefill_tokens_per_second_bucket{le="50000.0"} 2
freetoken_prefill_tokens_per_second_bucket{le="100000.0"} 2
freetoken_prefill_tokens_per_second_bucket{le="+Inf"} 2
freetoken_prefill_tokens_per_second_sum 41500.0
freetoken_prefill_tokens_per_second_count 2
"""

MOE_TEXT = """\
# HELP freetoken_moe_info Offloaded MoE runtime configuration.
# TYPE freetoken_moe_info gauge
freetoken_moe_info{backend="hybrid",policy="lru",device="cuda:0",expert_format="dense",cpu_activations="fp32"} 1
# HELP freetoken_moe_cache_slots Expert slots in the device cache.
# TYPE freetoken_moe_cache_slots gauge
freetoken_moe_cache_slots 96
# HELP freetoken_moe_cache_bytes Bytes of the device expert cache.
# TYPE freetoken_moe_cache_bytes gauge
freetoken_moe_cache_bytes 1610612736
# HELP freetoken_moe_slot_bytes Bytes of one expert slot.
# TYPE freetoken_moe_slot_bytes gauge
freetoken_moe_slot_bytes 16777216
# HELP freetoken_moe_total_experts Routed experts in the host banks.
# TYPE freetoken_moe_total_experts gauge
freetoken_moe_total_experts 4096
# HELP freetoken_moe_bank_bytes Bytes of all host expert banks.
# TYPE freetoken_moe_bank_bytes gauge
freetoken_moe_bank_bytes 68719476736
# HELP freetoken_moe_banks_pinned 1 when the host banks are page-locked.
# TYPE freetoken_moe_banks_pinned gauge
freetoken_moe_banks_pinned 1
# HELP freetoken_moe_split_ratio Moving average of the fraction of cache misses filled (q/m).
# TYPE freetoken_moe_split_ratio gauge
freetoken_moe_split_ratio 0.75
# HELP freetoken_moe_bandwidth_gbps Profiled bandwidths of the miss split in GB/s (link=p: B_P, link=h: B_H).
# TYPE freetoken_moe_bandwidth_gbps gauge
freetoken_moe_bandwidth_gbps{link="p"} 25.0
# HELP freetoken_moe_hits_total Routed experts found in the device expert cache.
# TYPE freetoken_moe_hits_total counter
freetoken_moe_hits_total{layer="0"} 40
freetoken_moe_hits_total{layer="1"} 55
# HELP freetoken_moe_misses_total Routed experts not in the device expert cache.
# TYPE freetoken_moe_misses_total counter
freetoken_moe_misses_total{layer="0"} 20
freetoken_moe_misses_total{layer="1"} 5
# HELP freetoken_moe_fills_total Misses copied into the device expert cache.
# TYPE freetoken_moe_fills_total counter
freetoken_moe_fills_total{layer="0"} 15
freetoken_moe_fills_total{layer="1"} 5
# HELP freetoken_moe_cpu_experts_total Misses run on the CPU from the host banks.
# TYPE freetoken_moe_cpu_experts_total counter
freetoken_moe_cpu_experts_total{layer="0"} 5
freetoken_moe_cpu_experts_total{layer="1"} 0
# HELP freetoken_moe_evictions_total Cache fills that replaced a resident expert.
# TYPE freetoken_moe_evictions_total counter
freetoken_moe_evictions_total{layer="0"} 3
freetoken_moe_evictions_total{layer="1"} 0
# HELP freetoken_moe_q_total Sum over forward calls of q chosen by the miss split.
# TYPE freetoken_moe_q_total counter
freetoken_moe_q_total{layer="0"} 12
freetoken_moe_q_total{layer="1"} 0
# HELP freetoken_moe_steps_total Forward calls of the MoE layer.
# TYPE freetoken_moe_steps_total counter
freetoken_moe_steps_total{layer="0"} 10
freetoken_moe_steps_total{layer="1"} 10
# HELP freetoken_moe_device_seconds_total Seconds spent in the device branch.
# TYPE freetoken_moe_device_seconds_total counter
freetoken_moe_device_seconds_total{layer="0"} 0.25
freetoken_moe_device_seconds_total{layer="1"} 0.125
# HELP freetoken_moe_cpu_seconds_total Seconds the CPU expert kernel ran.
# TYPE freetoken_moe_cpu_seconds_total counter
freetoken_moe_cpu_seconds_total{layer="0"} 1.5
freetoken_moe_cpu_seconds_total{layer="1"} 0.0
"""


def engine_part(text: str) -> str:
    """The page without the per-harness families (the shared server's sessions depend on which
    tests ran before; tests/server/test_sessions.py checks those families)."""
    keep = [ln for ln in text.splitlines(keepends=True)
            if "freetoken_harness_" not in ln and "freetoken_sessions" not in ln]
    return "".join(keep)


def test_engine_counters_only_without_a_runtime() -> None:
    assert render_metrics(COUNTERS, None).splitlines() == ENGINE_TEXT.splitlines()
    text = render_metrics(COUNTERS, None)
    assert text.endswith("\nfreetoken_prefill_tokens_per_second_count 2\n")


def test_moe_families_follow_the_engine_ones() -> None:
    stats = FakeMoe(layers=LAYERS).stats()
    assert render_metrics(COUNTERS, stats).splitlines() == (ENGINE_TEXT + MOE_TEXT).splitlines()


def test_pending_resize_unhealthy_and_label_escaping() -> None:
    moe = FakeMoe(slots=3, slot_bytes=MIB, total_experts=8)
    moe.pending = 5 * MIB
    stats = moe.stats()
    odd = type(stats)(**{**stats.__dict__, "device": 'cu"da\\0\n', "bandwidth_p_gbps": None,
                         "bandwidth_h_gbps": 12.5})
    lines = render_metrics(EngineCounters(), odd, healthy=False).splitlines()
    assert lines[2] == "freetoken_engine_healthy 0"
    assert ('freetoken_moe_info{backend="hybrid",policy="lru",device="cu\\"da\\\\0\\n",'
            'expert_format="dense",cpu_activations="fp32"} 1') in lines
    assert 'freetoken_moe_bandwidth_gbps{link="h"} 12.5' in lines
    assert not any(line.startswith('freetoken_moe_bandwidth_gbps{link="p"}') for line in lines)
    at = lines.index("# TYPE freetoken_moe_pending_resize_bytes gauge")
    assert lines[at + 1] == "freetoken_moe_pending_resize_bytes 5242880"
    # No layers: the per-layer families have no samples and are left out entirely.
    assert not any("freetoken_moe_hits_total" in line for line in lines)


def test_route_serves_text_and_takes_the_snapshot_between_steps(srv) -> None:
    srv.engine.fake_counters = COUNTERS
    r = srv.http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert engine_part(r.text) == ENGINE_TEXT
    assert srv.engine.between_steps_calls == 0  # nothing to ask without a runtime
    srv.engine.moe = FakeMoe(layers=LAYERS)
    r = srv.http.get("/metrics")
    assert engine_part(r.text) == ENGINE_TEXT + MOE_TEXT
    assert srv.engine.between_steps_calls == 1


UNHEALTHY_TEXT = ENGINE_TEXT.replace("\nfreetoken_engine_healthy 1\n",
                                     "\nfreetoken_engine_healthy 0\n")


def test_dead_loop_reports_unhealthy_without_moe_families(srv) -> None:
    srv.engine.fake_counters = COUNTERS
    srv.engine.moe = FakeMoe()
    srv.engine.loop_dead = True
    assert UNHEALTHY_TEXT.count("\nfreetoken_engine_healthy 0\n") == 1
    r = srv.http.get("/metrics")
    assert r.status_code == 200
    assert engine_part(r.text) == UNHEALTHY_TEXT
    srv.engine.healthy = False  # the health check itself says so: the runtime is not even asked
    srv.engine.loop_dead = False
    r = srv.http.get("/metrics")
    assert engine_part(r.text) == UNHEALTHY_TEXT
    assert srv.engine.between_steps_calls == 0


def test_metrics_needs_the_key_when_the_server_has_one(make_server) -> None:
    served = make_server(api_key="s3cret")
    r = served.http.get("/metrics")
    assert (r.status_code, r.json()) == (401, {"error": {
        "message": "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
        "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}})
    r = served.http.get("/metrics", headers={"x-api-key": "wrong"})
    assert (r.status_code, r.json()) == (401, {"error": {
        "message": "invalid API key", "type": "invalid_request_error", "param": None,
        "code": "invalid_api_key"}})
    r = served.http.get("/metrics", headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200 and r.text == render_metrics(EngineCounters(), None)
    served.assert_healthy()  # /health stays open


def test_memory_watcher_families_only_with_a_floor() -> None:
    stats = FakeMoe(slots=3, slot_bytes=MIB, total_experts=8).stats()
    assert "watcher" not in render_metrics(EngineCounters(), stats)
    watched = type(stats)(**{**stats.__dict__, "memory_floor_bytes": 2 * 2**30,
                             "watcher_shrinks": 3, "watcher_grows": 1})
    lines = render_metrics(EngineCounters(), watched).splitlines()
    at = lines.index("# TYPE freetoken_moe_memory_floor_bytes gauge")
    assert lines[at + 1] == "freetoken_moe_memory_floor_bytes 2147483648"
    at = lines.index("# TYPE freetoken_moe_watcher_resizes_total counter")
    assert lines[at + 1:at + 3] == ['freetoken_moe_watcher_resizes_total{direction="shrink"} 3',
                                    'freetoken_moe_watcher_resizes_total{direction="grow"} 1']
