"""The GGUF cache of ``compare_llamacpp.sh``: delete the files an older converter version wrote.

``compare_llamacpp.sh`` names each conversion ``small-<family>-<key>-<outtype>.gguf`` in
``$FREETOKEN_CACHE/peers/gguf`` (``<family>``: ``qwen3_moe`` / ``qwen3_next``, its ``--arch``;
``<key>``: 12 hex digits of the sha256 of the checkpoint stamp and the converter sources,
``<outtype>``: ``f32`` / ``bf16`` / ``f16``), and ``convert_gguf.py`` writes through
``<name>.tmp``. A file of that naming pattern and the same family whose key differs from the
current one can never be used again (the converter or the checkpoint changed): at ~2.5 GiB each
(f32), they are deleted once a new file is written. Files of the current key (other outtypes),
of the other family, and anything not matching the pattern exactly are kept.

Usage (project venv)::

    python evals/peers/gguf_cache.py prune CURRENT.gguf
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

NAME = re.compile(r"^small-(?P<family>qwen3_moe|qwen3_next)-(?P<key>[0-9a-f]{12})"
                  r"-(?P<outtype>f32|bf16|f16)\.gguf(?:\.tmp)?$")


def stale_files(current: Path) -> list[Path]:
    """The files beside ``current`` that match :data:`NAME` with ``current``'s family and another
    key, sorted by name.

    Raises:
        ValueError: ``current``'s own name does not match :data:`NAME`.
    """
    match = NAME.match(current.name)
    if match is None or current.name.endswith(".tmp"):
        raise ValueError(f"{current.name}: not a name of the form "
                         "small-<qwen3_moe|qwen3_next>-<12 hex>-<f32|bf16|f16>.gguf")
    family, key = match.group("family"), match.group("key")
    out = []
    for path in sorted(current.parent.iterdir()):
        m = NAME.match(path.name)
        if (m is not None and m.group("family") == family and m.group("key") != key
                and path.is_file() and not path.is_symlink()):
            out.append(path)
    return out


def prune(current: Path) -> list[Path]:
    """Delete :func:`stale_files` of ``current``; returns the deleted paths.

    Raises:
        ValueError: see :func:`stale_files`.
        OSError: a file cannot be deleted.
    """
    stale = stale_files(current)
    for path in stale:
        path.unlink()
    return stale


def main(argv: list[str] | None = None) -> int:
    """``prune CURRENT.gguf``: delete the stale files, one ``deleted <path> (<MiB>)`` line each
    on stderr; exit 2 for a current name outside the pattern."""
    p = argparse.ArgumentParser(prog="gguf_cache.py", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["prune"])
    p.add_argument("current", type=Path, help="the GGUF file just written (kept)")
    args = p.parse_args(argv)
    try:
        sizes = {path: path.stat().st_size for path in stale_files(args.current)}
        for path in prune(args.current):
            print(f"deleted stale {path} ({sizes[path] / 2**20:.0f} MiB)", file=sys.stderr)
    except ValueError as exc:
        print(f"gguf_cache: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
