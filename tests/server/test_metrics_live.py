"""``/metrics`` on the real engine (embedded tiny qwen3_next, prefix cache on): after two identical
completions the latency histograms count one TTFT / queue time / prefill speed per request and
one inter-token latency per sampled token after the first, and the prompt-token counters add up
(total = cached + recomputed) with the second request reusing the first one's prefix."""

from __future__ import annotations

import re

import httpx
import pytest
import torch

from freetoken.engine.async_engine import AsyncEngine
from freetoken.models.tiny import default_model_path
from freetoken.server import ServerConfig, create_app
from tests.server.srv_live import LiveServer

MAX_TOKENS = 5
HISTOGRAMS = ("freetoken_time_to_first_token_seconds", "freetoken_inter_token_latency_seconds",
              "freetoken_request_queue_time_seconds", "freetoken_prefill_tokens_per_second")
_SAMPLE = re.compile(r'^([a-z_]+)(?:\{le="([^"]+)"\})? (\S+)$')


@pytest.fixture(scope="module")
def live():
    engine = AsyncEngine.from_pretrained(default_model_path(), dtype=torch.float32, device="cpu")
    server = LiveServer(create_app(engine, ServerConfig(served_model_name="tiny",
                                                        max_output_tokens=16)))
    http = httpx.Client(base_url=server.base_url, timeout=60)
    yield http, engine
    http.close()
    server.stop()
    engine.shutdown()


def _scrape(http: httpx.Client) -> tuple[dict[str, float], dict[str, list[tuple[str, float]]]]:
    """Unlabelled samples by name, and each histogram's ``(le, value)`` buckets in page order."""
    r = http.get("/metrics")
    assert r.status_code == 200
    samples: dict[str, float] = {}
    buckets: dict[str, list[tuple[str, float]]] = {}
    for line in r.text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, le, value = match.group(1), match.group(2), float(match.group(3))
        if le is not None:
            buckets.setdefault(name.removesuffix("_bucket"), []).append((le, value))
        else:
            samples[name] = value
    return samples, buckets


def test_histograms_and_prompt_counters_after_two_identical_requests(live) -> None:
    http, engine = live
    before, _ = _scrape(http)
    assert before["freetoken_prompt_tokens_total"] == 0
    assert all(before[f"{h}_count"] == 0 for h in HISTOGRAMS)
    prompt = list(engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6))
    usages = []
    for _ in range(2):
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": prompt,
                                               "max_tokens": MAX_TOKENS, "temperature": 0,
                                               "ignore_eos": True})
        assert r.status_code == 200, r.text
        usages.append(r.json()["usage"])
    assert [u["completion_tokens"] for u in usages] == [MAX_TOKENS, MAX_TOKENS]
    cached = [u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for u in usages]
    assert cached[0] == 0 < cached[1] < len(prompt)  # the repeat reuses the prefix

    after, buckets = _scrape(http)
    assert after["freetoken_prompt_tokens_total"] == 2 * len(prompt)
    assert after["freetoken_prompt_tokens_cached_total"] == cached[1]
    assert after["freetoken_prompt_tokens_recomputed_total"] == 2 * len(prompt) - cached[1]
    assert after["freetoken_generation_tokens_total"] == 2 * MAX_TOKENS
    expected_counts = {"freetoken_time_to_first_token_seconds": 2,
                       "freetoken_inter_token_latency_seconds": 2 * (MAX_TOKENS - 1),
                       "freetoken_request_queue_time_seconds": 2,
                       "freetoken_prefill_tokens_per_second": 2}
    for name, count in expected_counts.items():
        assert after[f"{name}_count"] == count, name
        assert after[f"{name}_sum"] > 0, name
        values = [v for _, v in buckets[name]]
        assert values == sorted(values), name  # cumulative
        assert buckets[name][-1] == ("+Inf", count), name
        assert len(values) >= 2 and all(le != "+Inf" for le, _ in buckets[name][:-1]), name
