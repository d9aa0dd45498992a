"""The app served while the model loads (``freetoken.server.loading``): exact 503 / 529 bodies
per API with ``Retry-After``, the API-key guard still in front, the handover to the loaded app, a
failed load, and cancellation once the server stops."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from freetoken.models.load_progress import LoadStep
from freetoken.server.config import ServerConfig
from freetoken.server.loading import RETRY_AFTER_S, LoadCancelled, LoadingApp, LoadState
from freetoken.server.ui_routes import UI_DIR

LOADING = "the model is loading (weights 25%, 3 s so far); retry in 5 s"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def state() -> tuple[LoadState, Clock]:
    clock = Clock()
    s = LoadState(clock=clock)
    s.set_stage("weights")
    s.step(LoadStep(done_bytes=1024, total_bytes=4096, shard=1, num_shards=1, shard_done=False))
    clock.now += 3.0
    return s, clock


def _ready_app() -> Starlette:
    async def health(request):
        return JSONResponse({"status": "ok"})

    async def chat(request):
        return JSONResponse({"answered": True})

    return Starlette(routes=[Route("/health", health), Route("/v1/chat/completions", chat,
                                                             methods=["POST"])])


def test_health_reports_the_progress_and_every_api_its_own_503(state) -> None:
    s, _ = state
    started = []
    with TestClient(LoadingApp(s, ServerConfig(), start=lambda: started.append(1))) as http:
        assert started == [1]  # the loader starts at ASGI start-up, once
        r = http.get("/health")
        assert (r.status_code, r.headers["retry-after"]) == (503, str(RETRY_AFTER_S))
        assert r.json() == {"status": "loading", "progress": {
            "stage": "weights", "elapsed_s": 3.0, "done_bytes": 1024, "total_bytes": 4096,
            "fraction": 0.25}}
        r = http.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert (r.status_code, r.headers["retry-after"]) == (503, "5")
        assert r.json() == {"error": {"message": LOADING, "type": "server_error", "param": None,
                                      "code": "model_loading"}}
        r = http.post("/v1/messages?beta=true", json={"model": "m", "messages": []})
        assert (r.status_code, r.headers["retry-after"]) == (529, "5")  # Anthropic's overloaded
        assert r.json() == {"type": "error", "error": {"type": "overloaded_error",
                                                       "message": LOADING}}
        for method, path in (("GET", "/v1/models"), ("HEAD", "/"), ("POST", "/metrics"),
                             ("GET", "/v1/freetoken/status"), ("POST", "/v1/responses")):
            r = http.request(method, path)
            assert (r.status_code, r.headers["retry-after"]) == (503, "5"), path
        # the load's gauges for a scraper, and the operator page, which shows the progress
        r = http.get("/metrics")
        assert r.status_code == 200 and r.text == (
            "# HELP freetoken_engine_healthy 1 while the engine loop is alive.\n"
            "# TYPE freetoken_engine_healthy gauge\n"
            "freetoken_engine_healthy 0\n"
            "# HELP freetoken_loading 1 while the model loads (per stage).\n"
            "# TYPE freetoken_loading gauge\n"
            'freetoken_loading{stage="weights"} 1\n'
            "# HELP freetoken_loading_seconds Seconds since the model load started.\n"
            "# TYPE freetoken_loading_seconds gauge\n"
            "freetoken_loading_seconds 3.0\n"
            "# HELP freetoken_loading_fraction Share of the checkpoint bytes read so far (0-1).\n"
            "# TYPE freetoken_loading_fraction gauge\n"
            "freetoken_loading_fraction 0.25\n")
        r = http.get("/ui", follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (307, "/ui/")
        r = http.get("/ui/")
        assert r.status_code == 200 and r.text == (UI_DIR / "index.html").read_text()
        assert http.get("/ui/style.css").text == (UI_DIR / "style.css").read_text()
        assert http.get("/ui/missing.js").status_code == 404
    assert started == [1]


def test_stages_before_the_first_tensor_have_no_bytes() -> None:
    clock = Clock()
    s = LoadState(clock=clock)
    clock.now += 0.04
    with TestClient(LoadingApp(s, ServerConfig())) as http:
        assert http.get("/health").json() == {"status": "loading", "progress": {
            "stage": "starting", "elapsed_s": 0.0, "done_bytes": None, "total_bytes": None,
            "fraction": None}}
        s.set_stage("tokenizer")
        clock.now += 1.46
        assert http.get("/health").json()["progress"]["stage"] == "tokenizer"
        assert http.get("/v1/models").json()["error"]["message"] == (
            "the model is loading (tokenizer, 2 s so far); retry in 5 s")


def test_the_api_key_and_body_limit_still_apply_while_loading(state) -> None:
    s, _ = state
    config = ServerConfig(api_key="sekrit", max_body_bytes=64)
    with TestClient(LoadingApp(s, config)) as http:
        r = http.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = http.post("/v1/messages", json={"x": "y" * 100}, headers={"x-api-key": "sekrit"})
        assert r.status_code == 413 and r.json()["type"] == "error"
        r = http.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        assert http.get("/health").status_code == 503  # no key needed


def test_the_loaded_app_takes_over(state) -> None:
    s, _ = state
    with TestClient(LoadingApp(s, ServerConfig())) as http:
        assert http.get("/health").status_code == 503
        assert s.finish(_ready_app()) is True
        r = http.get("/health")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
        assert "retry-after" not in r.headers
        r = http.post("/v1/chat/completions", json={})
        assert (r.status_code, r.json()) == (200, {"answered": True})


def test_a_failed_load_is_reported_until_the_process_exits(state) -> None:
    s, _ = state
    s.fail("cannot load /m: truncated")
    with TestClient(LoadingApp(s, ServerConfig())) as http:
        r = http.get("/health")
        assert (r.status_code, r.json()) == (503, {"status": "failed",
                                                   "error": "cannot load /m: truncated"})
        r = http.post("/v1/messages", json={})
        assert r.status_code == 529
        assert r.json() == {"type": "error", "error": {
            "type": "overloaded_error",
            "message": "the model failed to load: cannot load /m: truncated"}}
        assert http.get("/v1/models").json()["error"]["code"] == "model_load_failed"


def test_stopping_cancels_the_load_and_refuses_a_late_engine(state) -> None:
    s, _ = state
    with TestClient(LoadingApp(s, ServerConfig())):
        pass  # ASGI shutdown closes the state
    with pytest.raises(LoadCancelled):
        s.step(LoadStep(2048, 4096, 1, 1, False))
    with pytest.raises(LoadCancelled):
        s.set_stage("engine")
    assert s.finish(_ready_app()) is False and s.app is None
