"""Where the generated tiny checkpoints are cached, and whether a cached one is current: the
stamp of what a checkpoint was made from. Torch-free, so ``freetoken serve`` finds the embedded
model without importing the generator (``tiny``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from freetoken.models.tiny_tokens import TOKENIZER_FILE
from freetoken.paths import TEMPLATES_DIR, cache_dir

# Bump whenever the generated files change for the same inputs (cached copies are then rebuilt).
GENERATOR_VERSION = 2
STAMP_FILE = "freetoken_tiny.json"
STAMP_KEYS = ("version", "arch", "preset", "seed", "config_overrides", "inputs_sha256")


def chat_template(arch: str) -> str:
    """The text of ``templates/<arch>.jinja``.

    Raises:
        FileNotFoundError: there is none.
    """
    path = TEMPLATES_DIR / f"{arch}.jinja"
    if not path.is_file():
        raise FileNotFoundError(f"chat template {path} not found")
    return path.read_text(encoding="utf-8")


def stamp(arch: str, preset: str, seed: int, overrides: dict | None = None) -> dict:
    """What a generated checkpoint was made from (a cached one is reused only if it matches)."""
    digest = hashlib.sha256(TOKENIZER_FILE.read_bytes() + chat_template(arch).encode()).hexdigest()
    return {"version": GENERATOR_VERSION, "arch": arch, "preset": preset, "seed": seed,
            "config_overrides": overrides or {}, "inputs_sha256": digest}


def matches(path: Path, expected: dict) -> bool:
    """Whether the checkpoint at ``path`` carries the stamp ``expected``."""
    try:
        found = json.loads((path / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return all(found.get(k) == expected[k] for k in STAMP_KEYS)


def cache_path(arch: str, preset: str) -> Path:
    """``cache_dir()/models/<preset>-<arch>``."""
    return cache_dir() / "models" / f"{preset}-{arch}"


def cached(arch: str, preset: str = "tiny", seed: int = 0) -> Path | None:
    """The cached checkpoint when it exists and is current, else None (to be generated)."""
    path = cache_path(arch, preset)
    return path if matches(path, stamp(arch, preset, seed)) else None
