"""Keeps the codebase in small files: no source file over the hard limit of 600 lines."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600
SOURCES = sorted(
    p for d in ("freetoken", "harness_adapters", "csrc", "evals")
    for p in (ROOT / d).rglob("*") if p.suffix in {".py", ".cpp", ".h", ".hpp"}
)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_file_under_line_limit(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (limit {MAX_LINES})"


def test_top_level_is_fixed() -> None:
    tracked = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
    expected = {"freetoken", "harness_adapters", "csrc", "templates", "evals", "tests",
                "pyproject.toml", "README.md", "Makefile"}
    assert expected <= tracked
    assert tracked - expected <= {"build", "dist", "freetoken.egg-info"}
