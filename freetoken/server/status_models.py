"""The typed answer of ``GET /v1/freetoken/status``: what the ``/ui`` page draws.

Units: times in seconds (``*_s``) or unix seconds (``*_at``, ``time``), sizes in bytes
(``*_bytes``), speeds in tokens per second, counts in tokens or requests as named.
"""

from __future__ import annotations

from pydantic import BaseModel

from freetoken.engine.recent import RequestTiming


class Totals(BaseModel):
    """Engine counters since start (``running`` / ``waiting``: now)."""

    requests_added: int
    requests_finished: int
    prompt_tokens: int
    generation_tokens: int
    cached_tokens: int
    running: int
    waiting: int


class LayerCache(BaseModel):
    """One MoE layer's expert-cache counters since start.

    Attributes:
        hit_rate: ``hits / (hits + misses)``, None before the first routed expert.
        fill_share: the q split: ``fills / misses`` (the rest ran on the CPU), None without misses.
        mean_q: mean q the miss split chose per forward call, None before the first call.
    """

    layer: int
    steps: int
    hits: int
    misses: int
    fills: int
    cpu_experts: int
    hit_rate: float | None
    fill_share: float | None
    mean_q: float | None


class ExpertCache(BaseModel):
    """The device expert cache of the offload runtime."""

    backend: str
    policy: str
    device: str
    slots: int
    slot_bytes: int
    bytes: int
    total_experts: int
    split_ratio: float
    pending_resize_bytes: int | None
    hit_rate: float | None
    layers: list[LayerCache]


class MemorySplit(BaseModel):
    """Where the engine's cache memory goes (bytes; None where the part does not exist).

    Attributes:
        kv_bytes / kv_used_bytes: the paged KV pool, all pages / pages not free.
        expert_cache_bytes: the device expert slots.
        checkpoint_device_bytes / checkpoint_host_bytes: live recurrent-state checkpoints.
    """

    kv_bytes: int | None
    kv_used_bytes: int | None
    kv_pages_total: int | None
    kv_pages_free: int | None
    expert_cache_bytes: int | None
    checkpoint_device_bytes: int | None
    checkpoint_host_bytes: int | None
    checkpoints_device: int | None
    checkpoints_host: int | None


class CheckpointHeld(BaseModel):
    """A checkpoint on a session's latest prompt path: its depth (tokens) and the anchor kind
    at that depth (``other``: no anchor of the prompt there, e.g. an earlier generation end)."""

    depth: int
    kind: str


class SessionStatus(BaseModel):
    """One live harness session (see ``GET /v1/sessions`` for the full object)."""

    id: str
    harness: str
    harness_title: str
    explicit: bool
    requests: int
    prompt_tokens: int
    reused_tokens: int
    generated_tokens: int
    last_used_at: int
    anchors: list[str] | None
    checkpoints: list[CheckpointHeld] | None


class HarnessStatus(BaseModel):
    """Sessions and finished requests of one harness adapter."""

    harness: str
    sessions: int
    requests: int
    reused_tokens: int
    recomputed_tokens: int


class Status(BaseModel):
    """``GET /v1/freetoken/status``."""

    time: float
    model: str
    healthy: bool
    totals: Totals
    recent: list[RequestTiming]  # validated and serialised as the engine records them
    expert_cache: ExpertCache | None
    memory: MemorySplit
    sessions: list[SessionStatus]
    harnesses: list[HarnessStatus]
