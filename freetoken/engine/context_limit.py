"""The context limit of a checkpoint (torch-free: ``freetoken serve`` checks it before it binds)."""

from __future__ import annotations

from pathlib import Path


def check_max_model_len(config, path: Path, max_model_len: int | None) -> int:
    """The config's ``max_position_embeddings`` (the default and upper bound of the context).

    Raises:
        ValueError: ``max_model_len`` is set and outside ``[2, max_position_embeddings]``.
    """
    limit = config.max_position_embeddings
    if max_model_len is not None and not 2 <= max_model_len <= limit:
        raise ValueError(f"max_model_len must be in [2, {limit}] for {path}, got {max_model_len}")
    return limit
