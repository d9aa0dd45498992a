"""``GET|POST /v1/freetoken/memory``: the expert cache snapshot, resizes run between steps, and
the exact OpenAI-shaped error of every bad request (the server stays healthy after each)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.server.srv_moe import MIB, FakeMoe

PATH = "/v1/freetoken/memory"
SIZE_HELP = ("expected a number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), "
             "e.g. 2GiB")
NO_RUNTIME = (
    "this server has no offloaded MoE runtime (resident backend: every expert stays on the "
    "device), so there is no expert cache to resize; start it with --moe-backend offload, cpu "
    "or hybrid"
)


def _error(message: str, param: str | None = None, code: str | None = None,
           kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def test_get_without_a_runtime_says_resident(srv) -> None:
    r = srv.http.get(PATH)
    assert (r.status_code, r.json()) == (200, {"backend": "resident", "expert_cache": None})


def test_get_reports_the_cache_from_between_steps(srv) -> None:
    srv.engine.moe = moe = FakeMoe(slots=96)
    moe.pending = 2 * 2**30
    r = srv.http.get(PATH)
    assert (r.status_code, r.json()) == (200, {
        "backend": "hybrid", "policy": "lru", "device": "cuda:0",
        "expert_cache": {"slots": 96, "slot_bytes": 16 * MIB, "bytes": 96 * 16 * MIB,
                         "total_experts": 4096, "bank_bytes": 4096 * 16 * MIB,
                         "banks_pinned": True, "pending_resize_bytes": 2 * 2**30,
                         "memory_floor_bytes": None, "expert_format": "dense",
                         "cpu_activations": "fp32"},
    })
    assert srv.engine.between_steps_calls == 1


@pytest.mark.parametrize(("value", "num_bytes", "slots"), [
    ("2.5GiB", 5 * 2**29, 160),
    (" 512 mib ", 512 * MIB, 32),
    (160 * 16 * MIB + 5, 160 * 16 * MIB + 5, 160),
    ("1B", 1, 1),  # below one slot: the runtime keeps one
])
def test_post_resizes_now(srv, value, num_bytes, slots) -> None:
    srv.engine.moe = moe = FakeMoe(slots=96)
    r = srv.http.post(PATH, json={"expert_cache": value})
    assert (r.status_code, r.json()) == (200, {"expert_cache": {
        "old_slots": 96, "slots": slots, "slot_bytes": 16 * MIB, "bytes": slots * 16 * MIB,
        "kept": min(96, slots)}})
    assert moe.resizes == [num_bytes]
    assert srv.engine.between_steps_calls == 1
    assert srv.http.get(PATH).json()["expert_cache"]["slots"] == slots


BAD_BODIES = [
    (b"{", "request body is not valid JSON: Expecting property name enclosed in double quotes: "
           "line 1 column 2 (char 1)", None),
    (b'"2GiB"', "request body must be a JSON object", None),
    (b"{}", "expert_cache: Field required", "expert_cache"),
    (b'{"expert_cache": "2GiB", "policy": "lru"}',
     "policy: unknown field (the only field is expert_cache)", "policy"),
    (b'{"expert_cache": "lots"}', f"expert_cache: invalid size 'lots': {SIZE_HELP}",
     "expert_cache"),
    (b'{"expert_cache": "2 XB"}', f"expert_cache: invalid size '2 XB': {SIZE_HELP}",
     "expert_cache"),
    (b'{"expert_cache": "0GiB"}', "expert_cache: invalid size '0GiB': must be at least 1 byte",
     "expert_cache"),
    (b'{"expert_cache": "16"}', "expert_cache: invalid size '16': give a unit, e.g. 16MiB or 16B "
     "(a bare number is ambiguous)", "expert_cache"),
    (b'{"expert_cache": "' + b"9" * 400 + b'GiB"}', "expert_cache: invalid size '" + "9" * 400
     + "GiB': larger than 4611686018427387904 bytes", "expert_cache"),
    (b'{"expert_cache": 0}', "expert_cache: must be at least 1 byte, got 0", "expert_cache"),
    (b'{"expert_cache": -4096}', "expert_cache: must be at least 1 byte, got -4096",
     "expert_cache"),
    # the hint suggests only sizes that would be accepted
    (b'{"expert_cache": "0.5"}', "expert_cache: invalid size '0.5': give a unit, e.g. 0.5MiB "
     "(a bare number is ambiguous)", "expert_cache"),
    (b'{"expert_cache": "' + b"9" * 30 + b'"}', "expert_cache: invalid size '" + "9" * 30
     + "': give a unit, e.g. MiB or GiB (a bare number is ambiguous)", "expert_cache"),
    # zero is refused as zero, not told to add a unit that would not help
    (b'{"expert_cache": "0"}', "expert_cache: invalid size '0': must be at least 1 byte",
     "expert_cache"),
    (b'{"expert_cache": "0.0B"}', "expert_cache: invalid size '0.0B': must be at least 1 byte",
     "expert_cache"),
    # an integer is held to the bound a size string is
    (b'{"expert_cache": ' + b"9" * 20 + b"}", "expert_cache: larger than 4611686018427387904 "
     "bytes, got " + "9" * 20, "expert_cache"),
] + [
    (f'{{"expert_cache": {raw}}}'.encode(),
     'expert_cache: expected a size string such as "2GiB" or an integer number of bytes, '
     f"got {kind}", "expert_cache")
    for raw, kind in [("null", "null"), ("true", "a boolean"), ("1.5e9", "a non-integer number"),
                      ('["2GiB"]', "an array"), ('{"GiB": 2}', "an object")]
]


@pytest.mark.parametrize(("body", "message", "param"), BAD_BODIES)
def test_bad_bodies_are_400_naming_the_problem(srv, body, message, param) -> None:
    srv.engine.moe = moe = FakeMoe()
    r = srv.http.post(PATH, content=body, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (400, _error(message, param))
    assert moe.resizes == [] and srv.engine.between_steps_calls == 0
    srv.assert_healthy()


def test_resize_without_a_runtime_is_409(srv) -> None:
    r = srv.http.post(PATH, json={"expert_cache": "2GiB"})
    assert (r.status_code, r.json()) == (409, _error(NO_RUNTIME))
    srv.assert_healthy()


def test_runtime_value_error_is_400_and_other_errors_500(srv) -> None:
    srv.engine.moe = moe = FakeMoe()
    moe.fail_resize = ValueError("the cpu backend has no device expert cache")
    r = srv.http.post(PATH, json={"expert_cache": "2GiB"})
    assert (r.status_code, r.json()) == (400, _error(
        "expert_cache: the cpu backend has no device expert cache", "expert_cache"))
    moe.fail_resize = MemoryError("cannot allocate 2 GiB")
    r = srv.http.post(PATH, json={"expert_cache": "2GiB"})
    assert (r.status_code, r.json()) == (500, _error(
        "internal server error: MemoryError: cannot allocate 2 GiB", kind="server_error"))
    srv.assert_healthy()


def test_dead_engine_is_503(srv) -> None:
    srv.engine.moe = moe = FakeMoe()
    unhealthy = _error("the engine is not healthy; try again later", kind="server_error")
    srv.engine.loop_dead = True  # died after the health check
    for r in (srv.http.get(PATH), srv.http.post(PATH, json={"expert_cache": 1})):
        assert (r.status_code, r.json()) == (503, unhealthy)
    srv.engine.loop_dead, srv.engine.healthy = False, False
    for r in (srv.http.get(PATH), srv.http.post(PATH, json={"expert_cache": 1})):
        assert (r.status_code, r.json()) == (503, unhealthy)
    assert moe.resizes == [] and srv.engine.between_steps_calls == 0


def test_memory_routes_need_the_key(make_server) -> None:
    served = make_server(api_key="s3cret")
    served.engine.moe = FakeMoe()
    missing = _error("missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                     code="invalid_api_key")
    for r in (served.http.get(PATH), served.http.post(PATH, json={"expert_cache": "1GiB"})):
        assert (r.status_code, r.json()) == (401, missing)
    r = served.http.post(PATH, json={"expert_cache": "1GiB"}, headers={"x-api-key": "s3cret"})
    assert r.status_code == 200 and r.json()["expert_cache"]["slots"] == 64



def test_startup_endpoint_list_matches_the_app(srv) -> None:
    from freetoken.launch import ENDPOINTS

    assert {("GET", "/metrics"), ("GET", PATH), ("POST", PATH)} <= {(m, p) for m, p, _ in ENDPOINTS}
    for method, path, _ in ENDPOINTS:  # every listed route exists (a bad body is a 400, not 404)
        r = srv.http.request(method, path.replace("{id}", "sess_x"), json={} if method == "POST" else None)
        if "{id}" in path:  # the route exists: the unknown id is its API's own 404
            error = r.json()["error"]
            if path.startswith("/v1/responses/"):
                assert (r.status_code, error["message"]) == (404, "Response with id 'sess_x' not found.")
            else:
                assert (r.status_code, error["code"]) == (404, "session_not_found"), (method, path)
            continue
        assert r.status_code in (200, 400), (method, path, r.status_code)


def test_get_reports_resident_experts_kept_in_a_kernel_format(srv) -> None:
    from freetoken.core import ResidentExperts

    info = srv.engine.info
    srv.engine.info = dataclasses.replace(
        info, resident_experts=ResidentExperts("mxfp4", 3342336, "q8"))
    try:
        r = srv.http.get(PATH)
    finally:
        srv.engine.info = info
    assert (r.status_code, r.json()) == (200, {
        "backend": "resident", "expert_cache": None,
        "resident_experts": {"expert_format": "mxfp4", "bank_bytes": 3342336,
                             "cpu_activations": "q8"}})
