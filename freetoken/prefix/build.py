"""Engine-facing settings of the prefix cache and the function that builds it for a model."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from freetoken.prefix.anchors import AnchorMarkers, AnchorPolicy
from freetoken.prefix.defaults import DEFAULT_MAX_RUNNING_REQUESTS
from freetoken.prefix.manager import (
    DEFAULT_CHECKPOINT_HOST_BYTES,
    DEFAULT_CHECKPOINT_SLOTS,
    DEFAULT_PAGE_SIZE,
    PrefixCache,
    PrefixConfig,
    default_num_pages,
)

DEFAULT_KV_MEMORY_FRACTION = 0.25


def default_kv_budget(device: torch.device | str | None) -> int:
    """Default KV pool byte cap: a quarter of free CUDA memory on a CUDA device (after the
    weights are loaded), else a quarter of physical host memory (bytes)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free * DEFAULT_KV_MEMORY_FRACTION)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(physical * DEFAULT_KV_MEMORY_FRACTION)


@dataclass(frozen=True)
class CacheConfig:
    """Serving-cache settings (CLI flags ``--page-size``, ``--kv-cache-bytes``,
    ``--state-checkpoint-slots``, ``--state-checkpoint-bytes``, ``--anchors``,
    ``--no-prefix-reuse``, ``--max-running-requests``).

    Attributes:
        page_size: tokens per KV page.
        kv_cache_bytes: size of the KV page pool (taken as given: requests longer than it are
            refused); None: room for ``max_running_requests`` full-length sequences within
            ``kv_budget_bytes`` (or :func:`default_kv_budget`), and at least one full-length
            sequence.
        kv_budget_bytes: the default pool's byte cap (``freetoken serve``: the memory plan's;
            on CUDA also at most the free memory when the pool is built); None:
            :func:`default_kv_budget`.
        checkpoint_slots: device-tier recurrent-state checkpoint slots.
        checkpoint_host_bytes: host-tier checkpoint byte budget.
        checkpoint_host_floor: host bytes (``MemAvailable``) to keep: below it the host tier
            shrinks (``freetoken.prefix.host_watcher``; ``freetoken serve``: the memory plan's
            host reserve); None: no watcher.
        anchors: block kinds that get recurrent-state checkpoints.
        prefix_reuse: False computes every request from position 0.
        max_running_requests: requests batched concurrently.
        checkpoint_interval: also checkpoint every this many prompt tokens (0: off; a baseline
            policy for benchmarks).

    Raises:
        ValueError: a size out of range.
    """

    page_size: int = DEFAULT_PAGE_SIZE
    kv_cache_bytes: int | None = None
    kv_budget_bytes: int | None = None
    checkpoint_slots: int = DEFAULT_CHECKPOINT_SLOTS
    checkpoint_host_bytes: int = DEFAULT_CHECKPOINT_HOST_BYTES
    checkpoint_host_floor: int | None = None
    anchors: AnchorPolicy = field(default_factory=AnchorPolicy.default)
    prefix_reuse: bool = True
    max_running_requests: int = DEFAULT_MAX_RUNNING_REQUESTS
    checkpoint_interval: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.page_size <= 4096:
            raise ValueError(f"page_size must be in [1, 4096], got {self.page_size}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be >= 1, got {self.kv_cache_bytes}")
        if self.checkpoint_slots < 0:
            raise ValueError(f"checkpoint_slots must be >= 0, got {self.checkpoint_slots}")
        if self.checkpoint_host_bytes < 0:
            raise ValueError(
                f"checkpoint_host_bytes must be >= 0, got {self.checkpoint_host_bytes}")
        if self.max_running_requests < 1:
            raise ValueError(
                f"max_running_requests must be >= 1, got {self.max_running_requests}")


def build_prefix_cache(model, tokenizer, max_model_len: int, config: CacheConfig,
                       device: torch.device | str | None = None) -> PrefixCache | None:
    """The prefix cache for ``model``, or None when the model has no paged state
    (``new_paged_state`` / ``kv_layout``; e.g. test stand-ins) or no attention layer.

    Args:
        model: a ``DecoderLM``.
        tokenizer: its tokenizer (anchor marker ids); None places only generation anchors.
        max_model_len: longest sequence (pool sizing).
        config: cache settings.
        device: where KV pages and device-tier checkpoints live.
    """
    if not hasattr(model, "new_paged_state") or not hasattr(model, "kv_layout"):
        return None
    kv_layout = model.kv_layout()
    if kv_layout is None:
        return None
    budget = config.kv_cache_bytes
    if budget is None and config.kv_budget_bytes is not None:
        budget = config.kv_budget_bytes
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dev.type == "cuda":  # the plan was made before loading: never above what is free now
            budget = min(budget, int(torch.cuda.mem_get_info(dev)[0]))
    if budget is None:
        budget = default_kv_budget(device)
    pages = default_num_pages(kv_layout, config.page_size, max_model_len,
                              config.max_running_requests, budget,
                              explicit=config.kv_cache_bytes is not None)
    markers = AnchorMarkers.from_tokenizer(tokenizer) if tokenizer is not None else None
    prefix_config = PrefixConfig(
        num_pages=pages, page_size=config.page_size, checkpoint_slots=config.checkpoint_slots,
        checkpoint_host_bytes=config.checkpoint_host_bytes, anchors=config.anchors,
        reuse=config.prefix_reuse, checkpoint_interval=config.checkpoint_interval,
    )
    return PrefixCache(prefix_config, kv_layout, model.recurrent_layout(), markers, device)
