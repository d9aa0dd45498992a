"""Operator routes: ``GET /metrics`` and ``GET|POST /v1/freetoken/memory`` (expert cache).

Everything the offload runtime is asked goes through ``engine.run_between_steps``, so a snapshot
or a resize never lands in the middle of a forward pass. Errors use the OpenAI shape.

Auth: ``/v1/freetoken/*`` is covered by ``GuardMiddleware`` like every ``/v1/*`` route;
``/metrics`` checks the same key here (when the server has one), since counters reveal traffic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from freetoken.engine.client import EngineDeadError
from freetoken.offload.control import MAX_BYTES, MOE_BACKENDS, MoeStats, ResizeResult, parse_bytes
from freetoken.server.config import ServerConfig
from freetoken.server.context import ServerContext, load_json
from freetoken.server.errors import APIError, bad_request
from freetoken.server.metrics import CONTENT_TYPE, render_metrics
from freetoken.server.status import health_and_moe_stats

T = TypeVar("T")
FIELD = "expert_cache"
RESIZABLE_BACKENDS = tuple(b for b in MOE_BACKENDS if b not in ("resident", "auto"))
NO_RUNTIME = (
    "this server has no offloaded MoE runtime (resident backend: every expert stays on the "
    "device), so there is no expert cache to resize; start it with --moe-backend "
    f"{', '.join(RESIZABLE_BACKENDS[:-1])} or {RESIZABLE_BACKENDS[-1]}"
)
_JSON_TYPES = {type(None): "null", bool: "a boolean", float: "a non-integer number",
               list: "an array", dict: "an object"}


def parse_resize_body(raw: bytes) -> int:
    """The requested cache size in bytes of a ``POST /v1/freetoken/memory`` body.

    ``{"expert_cache": "2GiB"}`` (a size string with a unit, see ``parse_bytes``) or
    ``{"expert_cache": 2147483648}`` (an integer number of bytes).

    Raises:
        APIError: 400 for malformed JSON, a non-object body, an unknown field, a missing
            ``expert_cache``, a value of another type, a bad size string or a size below 1 byte.
    """
    data = load_json(raw)
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    extra = sorted(k for k in data if k != FIELD)
    if extra:
        raise bad_request(f"{extra[0]}: unknown field (the only field is {FIELD})", param=extra[0])
    if FIELD not in data:
        raise bad_request(f"{FIELD}: Field required", param=FIELD)
    value: Any = data[FIELD]
    if isinstance(value, str):
        try:
            return parse_bytes(value, require_unit=True)
        except ValueError as exc:
            raise bad_request(f"{FIELD}: {exc}", param=FIELD) from None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise bad_request(f"{FIELD}: must be at least 1 byte, got {value}", param=FIELD)
        if value > MAX_BYTES:  # as a size string is refused
            raise bad_request(f"{FIELD}: larger than {MAX_BYTES} bytes, got {value}", param=FIELD)
        return value
    raise bad_request(f'{FIELD}: expected a size string such as "2GiB" or an integer number '
                      f"of bytes, got {_JSON_TYPES.get(type(value), type(value).__name__)}",
                      param=FIELD)


def memory_body(stats: MoeStats) -> dict:
    """The ``GET /v1/freetoken/memory`` answer for a runtime snapshot."""
    return {
        "backend": stats.backend,
        "policy": stats.policy,
        "device": stats.device,
        FIELD: {
            "slots": stats.num_slots,
            "slot_bytes": stats.slot_bytes,
            "bytes": stats.cache_bytes,
            "total_experts": stats.total_experts,
            "bank_bytes": stats.bank_bytes,
            "banks_pinned": stats.banks_pinned,
            "pending_resize_bytes": stats.pending_resize_bytes,
            "memory_floor_bytes": stats.memory_floor_bytes,
            "expert_format": stats.expert_format,
            "cpu_activations": stats.cpu_activations,
        },
    }


def resize_body(result: ResizeResult, memory_floor_bytes: int | None = None) -> dict:
    """The ``POST /v1/freetoken/memory`` answer for an applied resize; with a memory watcher,
    its floor (the watcher may shrink the cache again at its next check)."""
    body = {"old_slots": result.old_slots, "slots": result.new_slots,
            "slot_bytes": result.slot_bytes, "bytes": result.cache_bytes, "kept": result.kept}
    if memory_floor_bytes is not None:
        body["memory_floor_bytes"] = memory_floor_bytes
    return {FIELD: body}


def admin_router(ctx: ServerContext) -> APIRouter:
    """The operator routes bound to ``ctx``."""
    router = APIRouter()

    async def between_steps(fn: Callable[[], T]) -> T:
        """``fn()`` on the engine thread; 503 when the engine is dead."""
        ctx.check_healthy()
        try:
            return await ctx.engine.run_between_steps(fn)
        except EngineDeadError:
            raise APIError(503, "the engine is not healthy; try again later") from None

    @router.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text: engine counters, plus the MoE runtime's when there is one."""
        engine = ctx.engine
        healthy, stats = await health_and_moe_stats(engine)
        text = render_metrics(engine.counters(), stats, healthy=healthy,
                              sessions=ctx.sessions.metrics())
        return Response(text, media_type=CONTENT_TYPE)

    @router.get("/v1/freetoken/memory")
    async def get_memory() -> Response:
        """The expert cache (``expert_cache: null`` on the resident backend, with
        ``resident_experts`` when a CPU device keeps them in a kernel format); under
        ``freetoken serve`` also the start-up memory plan as ``plan``."""
        moe = ctx.engine.moe
        plan = getattr(ctx.engine, "memory_plan", None)
        if moe is None:
            body = {"backend": "resident", FIELD: None}
            banked = ctx.engine.info.resident_experts
            if banked is not None:
                body["resident_experts"] = {"expert_format": banked.format,
                                            "bank_bytes": banked.bytes,
                                            "cpu_activations": banked.cpu_activations}
        else:
            body = memory_body(await between_steps(moe.stats))
        if plan is not None:  # the start-up memory plan (freetoken serve)
            body["plan"] = plan.as_dict()
        return JSONResponse(body)

    @router.post("/v1/freetoken/memory")
    async def set_memory(request: Request) -> Response:
        """Resize the expert cache now (between two steps); 409 without an offload runtime."""
        num_bytes = parse_resize_body(await request.body())
        moe = ctx.engine.moe
        if moe is None:
            raise APIError(409, NO_RUNTIME)
        try:
            result, floor = await between_steps(
                lambda: (moe.resize_now(num_bytes), moe.stats().memory_floor_bytes))
        except ValueError as exc:
            raise bad_request(f"{FIELD}: {exc}", param=FIELD) from None
        return JSONResponse(resize_body(result, floor))

    return router
