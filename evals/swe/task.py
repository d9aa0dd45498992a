"""The SWE task: a small repository, its issue text and the test the fix must make pass.

A task folder (``evals/swe_task`` is the bundled one, project-written) holds ``task.json``::

    {"name": str, "repo": "repo", "issue": "ISSUE.md",
     "failing_tests": ["tests/test_x.py::test_y", ...], "suite": ["tests"]}

``repo`` is copied into a scratch folder for the agent; after the agent exits, the suite and the
failing tests are run in that copy (one pytest run) with the given python (the project's), and the
copy is compared with the original file by file (``tree_diff``, a unified diff made with ``difflib``).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

TASK_DIR = Path(__file__).resolve().parents[1] / "swe_task"
IGNORED_DIRS = {"__pycache__", ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache"}
IGNORED_SUFFIXES = (".pyc", ".pyo")
TEST_TIMEOUT_S = 300.0


class TaskError(ValueError):
    """The task folder is missing or its ``task.json`` is malformed; the message names the file."""


@dataclass(frozen=True)
class SweTask:
    """A loaded task. ``repo`` is the original repository folder (never modified)."""

    name: str
    folder: Path
    repo: Path
    issue: str
    failing_tests: tuple[str, ...]
    suite: tuple[str, ...]

    def prompt(self) -> str:
        """The task text the agent gets: the issue, then where the code is and how to test it."""
        tests = " ".join(self.suite)
        return (f"{self.issue.strip()}\n\nThe repository is the current working directory. "
                f"Its tests run with `python -m pytest -q {tests}`.")


def load_task(folder: Path = TASK_DIR) -> SweTask:
    """Read ``folder/task.json`` and the issue text it names.

    Raises:
        TaskError: no ``task.json``, invalid JSON, a missing key or wrong type, or a named file or
            folder that does not exist.
    """
    spec_path = folder / "task.json"
    try:
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskError(f"{spec_path}: no such file (a SWE task folder needs a task.json)") from None
    except ValueError as exc:
        raise TaskError(f"{spec_path}: invalid JSON ({exc})") from None
    for key, kind in (("name", str), ("repo", str), ("issue", str), ("failing_tests", list), ("suite", list)):
        if not isinstance(spec.get(key), kind):
            raise TaskError(f"{spec_path}: {key!r} must be a {kind.__name__}")
    if not spec["failing_tests"] or not all(isinstance(t, str) and t for t in spec["failing_tests"]):
        raise TaskError(f"{spec_path}: 'failing_tests' must list at least one pytest node id")
    if not all(isinstance(t, str) and t for t in spec["suite"]):
        raise TaskError(f"{spec_path}: 'suite' must list pytest paths")
    repo, issue = folder / spec["repo"], folder / spec["issue"]
    if not repo.is_dir():
        raise TaskError(f"{spec_path}: repository folder {repo} does not exist")
    if not issue.is_file():
        raise TaskError(f"{spec_path}: issue file {issue} does not exist")
    return SweTask(spec["name"], folder, repo, issue.read_text(encoding="utf-8"),
                   tuple(spec["failing_tests"]), tuple(spec["suite"]))


def _ignored(name: str) -> bool:
    return name in IGNORED_DIRS or name.endswith(IGNORED_SUFFIXES)


def copy_repo(task: SweTask, dest: Path) -> Path:
    """Copy the task's repository to ``dest`` (which must not exist), without caches; returns ``dest``."""
    shutil.copytree(task.repo, dest, ignore=lambda _dir, names: [n for n in names if _ignored(n)])
    return dest


def _files(root: Path) -> dict[str, Path]:
    """Relative POSIX path -> file, for every regular file under ``root`` outside ignored folders."""
    found: dict[str, Path] = {}
    for current, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not _ignored(d))
        for name in sorted(names):
            path = Path(current) / name
            if not _ignored(name) and path.is_file() and not path.is_symlink():
                found[path.relative_to(root).as_posix()] = path
    return found


def _lines(path: Path) -> list[str] | None:
    """The file's lines (line ends kept), or None when it is not UTF-8 text."""
    try:
        return path.read_text(encoding="utf-8").splitlines(keepends=True)
    except (UnicodeDecodeError, OSError):
        return None


def tree_diff(before: Path, after: Path) -> tuple[str, list[str]]:
    """A unified diff (``a/`` and ``b/`` prefixes, ``/dev/null`` for added or deleted files) from
    ``before`` to ``after``, and the sorted relative paths of the files that differ.

    Caches (``__pycache__``, ``.pytest_cache``, ``*.pyc``, ``.git``) are left out; a non-UTF-8 file
    that changed is listed as ``Binary files ... differ``. A last line without a newline is marked
    with git's ``\\ No newline at end of file``.
    """
    old, new = _files(before), _files(after)
    out: list[str] = []
    changed: list[str] = []
    for rel in sorted(set(old) | set(new)):
        a = old[rel].read_bytes() if rel in old else None
        b = new[rel].read_bytes() if rel in new else None
        if a == b:
            continue
        changed.append(rel)
        a_lines = _lines(old[rel]) if rel in old else []
        b_lines = _lines(new[rel]) if rel in new else []
        a_name = f"a/{rel}" if rel in old else "/dev/null"
        b_name = f"b/{rel}" if rel in new else "/dev/null"
        if a_lines is None or b_lines is None:
            out.append(f"Binary files {a_name} and {b_name} differ\n")
            continue
        for line in difflib.unified_diff(a_lines, b_lines, a_name, b_name):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out), changed


OUTCOME_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+)")  # pytest -rA short summary


@dataclass(frozen=True)
class PytestRun:
    """One pytest run in the task copy: ``rc`` is pytest's exit code (0 all passed, 1 some failed,
    2-5 interrupted / internal error / usage error / nothing collected; None: timed out),
    ``summary`` its last line (e.g. ``1 failed, 4 passed in 0.05s``), ``outcomes`` node id ->
    ``PASSED`` / ``FAILED`` / ``ERROR`` / ``XFAIL`` / ``XPASS`` from the ``-rA`` short summary,
    ``output`` the output tail."""

    args: tuple[str, ...]
    rc: int | None
    summary: str
    outcomes: dict[str, str]
    output: str

    @property
    def passed(self) -> bool:
        """Every selected test ran and passed."""
        return self.rc == 0

    def all_passed(self, node_ids: tuple[str, ...]) -> bool:
        """Whether each of ``node_ids`` ran and passed (a test that did not run has not passed)."""
        return all(self.outcomes.get(node) == "PASSED" for node in node_ids)

    def as_dict(self) -> dict:
        """The run for report.json."""
        return {"args": list(self.args), "rc": self.rc, "passed": self.passed, "summary": self.summary,
                "outcomes": self.outcomes, "output_tail": self.output}


def run_tests(python: str, repo: Path, targets: tuple[str, ...], timeout: float = TEST_TIMEOUT_S) -> PytestRun:
    """``python -m pytest -q -rA -p no:cacheprovider TARGETS`` in ``repo`` (bytecode writing off, the
    caller's PYTHONPATH and PYTEST_ADDOPTS dropped so only the copy's code and config count).
    pytest runs a test named twice (by folder and by node id) once."""
    args = ("-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *targets)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        proc = subprocess.run([python, *args], cwd=repo, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return PytestRun(args, None, f"timed out after {timeout:.0f}s", {}, text[-4000:])
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    outcomes = {m.group(2): m.group(1) for m in map(OUTCOME_LINE.match, lines) if m}
    return PytestRun(args, proc.returncode, lines[-1].strip("= ") if lines else "", outcomes,
                     proc.stdout[-4000:])
