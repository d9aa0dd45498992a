"""Filesystem locations: the repo's templates/ folder and the per-user cache directory."""

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
