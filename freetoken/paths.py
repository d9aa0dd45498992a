"""Filesystem locations: the repo's templates/ folder, the per-user cache directory and the
project's read-only shared data (``../shared``: real agent traces, recorded MoE routing)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TEMPLATES_DIR = REPO_ROOT / "templates"
ASSETS_DIR = Path(__file__).resolve().parent / "assets"


def cache_dir() -> Path:
    """Cache root: ``$FREETOKEN_CACHE`` or ``~/.cache/freetoken`` (created on demand)."""
    root = Path(os.environ.get("FREETOKEN_CACHE", Path.home() / ".cache" / "freetoken"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def shared_dir() -> Path:
    """The shared data folder: ``$FREETOKEN_SHARED``, else ``shared/`` beside the repository
    (``traces/``, ``routing/``, ``research/``). It is not part of the repository and may be absent;
    callers check and say so."""
    return Path(os.environ.get("FREETOKEN_SHARED", REPO_ROOT.parent / "shared"))
