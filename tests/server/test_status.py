"""``GET /v1/freetoken/status`` on the real engine (embedded tiny qwen3_next, hybrid offload with
half the experts cached, prefix cache on), and the static ``/ui`` files it feeds."""

from __future__ import annotations

import httpx
import pytest
import torch

from freetoken.models.tiny import default_model_path
from freetoken.offload.backend import MoeConfig
from freetoken.prefix.anchors import AnchorMarkers
from freetoken.server import ServerConfig, create_app
from freetoken.server.status import checkpoint_kinds
from tests.server.srv_live import LiveServer

CHAT = {"model": "tiny", "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture(scope="module")
def live():
    from freetoken.engine.async_engine import AsyncEngine

    engine = AsyncEngine.from_pretrained(default_model_path(), dtype=torch.float32, device="cpu",
                                         moe=MoeConfig(backend="hybrid", cache="0.5"))
    app = create_app(engine, ServerConfig(served_model_name="tiny", max_output_tokens=16))
    server = LiveServer(app)
    http = httpx.Client(base_url=server.base_url, timeout=60)
    yield http, engine
    http.close()
    server.stop()
    engine.shutdown()


def test_status_reports_real_requests_cache_memory_and_sessions(live) -> None:
    http, engine = live
    before = http.get("/v1/freetoken/status").json()
    r = http.post("/v1/chat/completions", json=CHAT, headers={"X-FreeToken-Harness": "openclaw"})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    s = http.get("/v1/freetoken/status").json()

    assert s["model"] == "tiny" and s["healthy"] is True
    t = s["totals"]
    assert t["requests_finished"] == before["totals"]["requests_finished"] + 1
    generated = t["generation_tokens"] - before["totals"]["generation_tokens"]
    assert generated == usage["completion_tokens"]
    last = s["recent"][-1]
    assert last["request_id"] == r.json()["id"]
    assert last["seq"] == len(before["recent"]) + 1
    assert (last["prompt_tokens"], last["output_tokens"]) == (usage["prompt_tokens"],
                                                             usage["completion_tokens"])
    assert last["ttft_s"] > 0 and last["decode_tok_s"] > 0

    cache = s["expert_cache"]
    assert (cache["backend"], cache["slots"], cache["total_experts"]) == ("hybrid", 32, 64)
    assert len(cache["layers"]) == 4
    for layer in cache["layers"]:
        assert layer["hits"] + layer["misses"] > 0
        assert layer["hit_rate"] == pytest.approx(layer["hits"] / (layer["hits"] + layer["misses"]))
        assert layer["fills"] + layer["cpu_experts"] == layer["misses"]

    mem = s["memory"]
    assert mem["expert_cache_bytes"] == cache["bytes"] == 32 * cache["slot_bytes"]
    assert mem["kv_bytes"] == mem["kv_pages_total"] * engine.kv_page_bytes
    assert 0 < mem["kv_used_bytes"] <= mem["kv_bytes"]
    assert mem["checkpoints_device"] > 0 and mem["checkpoint_device_bytes"] > 0

    (claw,) = [x for x in s["sessions"] if x["harness"] == "openclaw"]
    assert claw["requests"] == 1 and claw["prompt_tokens"] == usage["prompt_tokens"]
    kinds = {c["kind"] for c in claw["checkpoints"]}
    assert {"turn_start", "generation_start"} <= kinds
    depths = [c["depth"] for c in claw["checkpoints"]]
    assert depths == sorted(depths)
    (harness,) = [h for h in s["harnesses"] if h["harness"] == "openclaw"]
    assert (harness["sessions"], harness["requests"]) == (1, 1)


def test_status_follows_a_resize(live) -> None:
    http, _ = live
    slot = http.get("/v1/freetoken/status").json()["expert_cache"]["slot_bytes"]
    r = http.post("/v1/freetoken/memory", json={"expert_cache": f"{5 * slot}B"})
    assert r.status_code == 200, r.text
    s = http.get("/v1/freetoken/status").json()
    assert s["expert_cache"]["slots"] == 5
    assert s["memory"]["expert_cache_bytes"] == 5 * slot


def test_ui_files_are_served(live) -> None:
    http, _ = live
    r = http.get("/ui", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (307, "/ui/")
    page = http.get("/ui/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for asset in ("app.js", "api.js", "chat.js", "charts.js", "style.css"):
        assert f'"{asset}"' in page.text
        assert http.get(f"/ui/{asset}").status_code == 200
    assert "http" not in page.text.replace('"http://www.w3.org', "")  # nothing from the network
    assert http.get("/ui/missing.js").status_code == 404


def test_checkpoint_kinds_names_the_anchor_at_each_depth() -> None:
    markers = AnchorMarkers(turn_start=frozenset({1}), thinking_start=frozenset({2}),
                            tool_call_start=frozenset({3}), tool_output_start=frozenset({4}))
    prompt = [1, 9, 9, 1, 3, 9, 4, 9, 1, 2, 9]
    got = checkpoint_kinds(prompt, [3, 4, 5, 6, 8, 9, 10, 11], markers)
    assert [(c.depth, c.kind) for c in got] == [
        (3, "turn_start"), (4, "tool_call_start"), (5, "other"), (6, "tool_output_start"),
        (8, "turn_start"), (9, "thinking_start"), (10, "generation_start"),
        (11, "generation_start")]


def test_status_needs_the_api_key(make_server) -> None:
    served = make_server(api_key="k")
    assert served.http.get("/v1/freetoken/status").status_code == 401
    r = served.http.get("/v1/freetoken/status", headers={"Authorization": "Bearer k"})
    assert r.status_code == 200
    s = r.json()
    assert (s["expert_cache"], s["recent"], s["memory"]["kv_bytes"]) == (None, [], None)
    assert served.http.get("/ui/").status_code == 200  # the page itself carries no data
