"""Assembles ``GET /v1/freetoken/status`` (:class:`~freetoken.server.status_models.Status`) from
what the engine, the offload runtime and the session store already keep; nothing new is counted
here except the engine's ring of recent requests (``freetoken.engine.recent``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from freetoken.engine.client import EngineDeadError
from freetoken.engine.counters import EngineCounters
from freetoken.offload.control import MoeStats
from freetoken.prefix.anchors import AnchorKind, AnchorMarkers, AnchorPolicy, find_anchors
from freetoken.server.context import ServerContext
from freetoken.server.sessions import Session
from freetoken.server.status_models import (
    CheckpointHeld,
    ExpertCache,
    HarnessStatus,
    LayerCache,
    MemorySplit,
    SessionStatus,
    Status,
    Totals,
)

MAX_SESSIONS = 16
"""Most recently used sessions reported (each costs one engine round trip for its checkpoints)."""


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def expert_cache(stats: MoeStats) -> ExpertCache:
    """The expert cache part, with per-layer hit rates and the q split."""
    layers = [LayerCache(layer=s.layer, steps=s.steps, hits=s.hits, misses=s.misses,
                         fills=s.fills, cpu_experts=s.cpu_experts,
                         hit_rate=_ratio(s.hits, s.hits + s.misses),
                         fill_share=_ratio(s.fills, s.misses), mean_q=_ratio(s.q_sum, s.steps))
              for s in stats.layers]
    hits = sum(s.hits for s in stats.layers)
    misses = sum(s.misses for s in stats.layers)
    return ExpertCache(backend=stats.backend, policy=stats.policy, device=stats.device,
                       slots=stats.num_slots, slot_bytes=stats.slot_bytes, bytes=stats.cache_bytes,
                       total_experts=stats.total_experts, split_ratio=stats.split_ratio,
                       pending_resize_bytes=stats.pending_resize_bytes,
                       hit_rate=_ratio(hits, hits + misses), layers=layers)


def memory_split(counters: EngineCounters, page_bytes: int | None,
                 stats: MoeStats | None) -> MemorySplit:
    """KV pages, expert slots and checkpoints in bytes (``counters.prefix``: see
    ``PrefixCache.stats``; ``page_bytes``: bytes of one KV page)."""
    p = counters.prefix
    total, free = p.get("kv_pages_total"), p.get("kv_pages_free")
    kv = kv_used = None
    if page_bytes is not None and total is not None and free is not None:
        kv, kv_used = total * page_bytes, (total - free) * page_bytes
    return MemorySplit(
        kv_bytes=kv, kv_used_bytes=kv_used, kv_pages_total=total, kv_pages_free=free,
        expert_cache_bytes=None if stats is None else stats.cache_bytes,
        checkpoint_device_bytes=p.get("checkpoint_device_bytes_used"),
        checkpoint_host_bytes=p.get("checkpoint_host_bytes_used"),
        checkpoints_device=p.get("checkpoint_device_count"),
        checkpoints_host=p.get("checkpoint_host_count"),
    )


def checkpoint_kinds(prompt: Sequence[int], depths: Sequence[int],
                     markers: AnchorMarkers) -> list[CheckpointHeld]:
    """The anchor kind at each checkpoint depth of ``prompt``: a block marker of any kind, the
    generation start (the prompt's end, or one token before it), else ``other``."""
    at = {a.position: a.kind.value for a in find_anchors(prompt, markers, AnchorPolicy.all())}
    end = len(prompt)
    out = []
    for depth in depths:
        kind = at.get(depth)
        if kind is None:
            kind = AnchorKind.GENERATION_START.value if depth in (end, end - 1) else "other"
        out.append(CheckpointHeld(depth=depth, kind=kind))
    return out


def totals(counters: EngineCounters) -> Totals:
    """The engine counters part."""
    return Totals(requests_added=counters.requests_added,
                  requests_finished=sum(counters.finished.values()),
                  prompt_tokens=counters.prompt_tokens,
                  generation_tokens=counters.generation_tokens,
                  cached_tokens=counters.cached_tokens, running=counters.running,
                  waiting=counters.waiting)



async def health_and_moe_stats(engine) -> tuple[bool, MoeStats | None]:
    """Whether the engine is healthy, and its MoE runtime's stats (read between two steps) when
    it has one and is healthy; an engine that dies meanwhile reads as unhealthy."""
    healthy = engine.is_healthy()
    if engine.moe is None or not healthy:
        return healthy, None
    try:
        return True, await engine.run_between_steps(engine.moe.stats)
    except EngineDeadError:
        return False, None

class StatusBuilder:
    """Builds the status of one app (keeps the tokenizer's anchor markers)."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        try:
            self.markers = AnchorMarkers.from_tokenizer(ctx.engine.tokenizer)
        except TypeError:  # a tokenizer without a vocabulary lookup (test doubles)
            self.markers = AnchorMarkers.empty()

    async def session(self, session: Session) -> SessionStatus:
        """One session, with the checkpoints held on its latest prompt's path."""
        held = None
        if session.last_prompt and self.ctx.engine.is_healthy():
            try:
                depths = await self.ctx.engine.prefix_checkpoint_depths(session.last_prompt)
            except EngineDeadError:
                depths = None
            if depths is not None:
                held = checkpoint_kinds(session.last_prompt, depths, self.markers)
        anchors = (sorted(k.value for k in session.anchors.kinds)
                   if session.anchors is not None else None)
        return SessionStatus(id=session.id, harness=session.adapter.name,
                             harness_title=session.adapter.title, explicit=session.explicit,
                             requests=session.requests, prompt_tokens=session.prompt_tokens,
                             reused_tokens=session.reused_tokens,
                             generated_tokens=session.generated_tokens,
                             last_used_at=int(session.last_used), anchors=anchors,
                             checkpoints=held)

    async def build(self) -> Status:
        """The whole status now."""
        engine = self.ctx.engine
        healthy, stats = await health_and_moe_stats(engine)
        counters = engine.counters()
        harness_totals, live = self.ctx.sessions.metrics()
        harnesses = [HarnessStatus(harness=name, sessions=live.get(name, 0),
                                   requests=t.requests if t else 0,
                                   reused_tokens=t.reused_tokens if t else 0,
                                   recomputed_tokens=t.recomputed_tokens if t else 0)
                     for name in sorted({*harness_totals, *live})
                     for t in [harness_totals.get(name)]]
        sessions = [await self.session(s) for s in self.ctx.sessions.list()[:MAX_SESSIONS]]
        return Status(
            time=time.time(), model=self.ctx.config.served_model_name, healthy=healthy,
            totals=totals(counters),
            recent=list(engine.recent_requests()),
            expert_cache=None if stats is None else expert_cache(stats),
            memory=memory_split(counters, engine.kv_page_bytes, stats),
            sessions=sessions, harnesses=harnesses,
        )
