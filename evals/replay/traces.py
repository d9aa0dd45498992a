"""Trace files of ../shared/traces as replay plans: the calls of a workload in recorded order,
each with the calls it has to wait for.

File format: ``traces/README.md`` (one model call per line: ``messages``, ``tools``,
``response``, ``meta``). Files of one session share the name before ``__``. Order within a
session is the one ``evals/prefix_traces.py`` uses (it reads files with :func:`load_thread` and
places sub-agents with :func:`spawn_points` from here; this module imports no torch, so the replay
client runs without the engine installed):

* claude-trace captures (every call has ``meta.row``): one chain in capture-row order;
* otherwise the ``__main`` file (else the first file) is the main thread; every other file is a
  sub-agent thread inserted right after the main call whose response holds its
  ``meta.parent_task_tool_use_id`` (else after the main thread's n-th ``task``/``Task`` call);
  sub-agents spawned by the same call are round-robin interleaved.

Dependencies (what makes W3 concurrent "as recorded"): a call waits for the previous call of its
thread; a sub-agent's first call waits for the main call that spawned it; a main call waits for
every sub-agent thread that was spawned before it (it reads their results). Sessions run one
after the other (their first calls wait for every call of the previous session) unless the
workload's sessions are independent (W1). Every dependency points to an earlier call of the
order, so the first N calls of a plan are a closed plan (``--limit-turns``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Call:
    """One model call to replay.

    Attributes:
        key: unique id, ``"<thread>#<turn>"``.
        session: the session (replay unit) it belongs to.
        thread: the trace file stem (or an assembled thread's name).
        turn: its index within the thread.
        protocol: wire format of the recording, ``"openai"`` or ``"anthropic"``.
        harness: harness adapter whose edits apply (``harness_adapters.get_adapter`` name).
        messages: the recorded request history (wire format, system prompt first when recorded).
        tools: the recorded tool definitions (wire format), or None.
        response: the recorded reply (wire format, ``usage`` when recorded), or None.
        deps: keys of the calls that must finish before this one starts.
    """

    key: str
    session: str
    thread: str
    turn: int
    protocol: str
    harness: str
    messages: list
    tools: list | None
    response: dict | None
    deps: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Thread:
    """One trace file: its lines and the ``meta`` of its first line."""

    name: str
    protocol: str
    lines: tuple[dict, ...]
    meta: dict


def load_thread(path: Path) -> Thread:
    """Read one trace file.

    Raises:
        FileNotFoundError: no such file. ValueError: an empty file, a line that is not JSON or
            a line without a non-empty ``messages`` list (naming the file and line).
    """
    lines = []
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(line, dict) or not isinstance(line.get("messages"), list) \
                or not line["messages"]:
            raise ValueError(f"{path}:{n}: a trace line needs a non-empty 'messages' list")
        lines.append(line)
    if not lines:
        raise ValueError(f"{path}: no model calls")
    meta = lines[0].get("meta") or {}
    protocol = "anthropic" if str(meta.get("protocol", "")).startswith("anthropic") else "openai"
    return Thread(path.stem, protocol, tuple(lines), meta)


def called_ids(response: dict | None) -> list[tuple[str, str]]:
    """``(tool name, call id)`` of every tool call in a recorded response (both wire formats)."""
    if not response:
        return []
    out = [(str((c.get("function") or {}).get("name", "")), str(c.get("id") or ""))
           for c in response.get("tool_calls") or []]
    content = response.get("content")
    if isinstance(content, list):
        out += [(str(b.get("name", "")), str(b.get("id", ""))) for b in content
                if isinstance(b, dict) and b.get("type") == "tool_use"]
    return out


def spawn_points(main_responses: list[dict | None], subs: list) -> dict[int, list]:
    """Where each sub-agent thread of a session starts: ``{index of the main-thread call it
    follows: [sub threads spawned there, in order]}`` (module docstring).

    A sub thread (anything with a ``meta`` dict) goes after the main call whose response holds its
    ``meta.parent_task_tool_use_id``; without that id, the n-th sub goes after the main thread's
    n-th call of a tool named ``task``; otherwise after the last main call.

    Args:
        main_responses: the recorded response of every main-thread call, in order.
        subs: the other threads of the session, in order.
    """
    ids = [{cid for _, cid in called_ids(r)} for r in main_responses]
    task_at = [i for i, r in enumerate(main_responses)
               for name, _ in called_ids(r) if name.lower() == "task"]
    spawn: dict[int, list] = {}
    for n, sub in enumerate(subs):
        parent = sub.meta.get("parent_task_tool_use_id")
        at = next((i for i, got in enumerate(ids) if parent and parent in got), None)
        if at is None and parent is None and n < len(task_at):
            at = task_at[n]
        spawn.setdefault(len(main_responses) - 1 if at is None else at, []).append(sub)
    return spawn


def _calls(thread: Thread, session: str, harness: str) -> list[Call]:
    return [Call(f"{thread.name}#{i}", session, thread.name, i, thread.protocol, harness,
                 line["messages"], line.get("tools"), line.get("response"))
            for i, line in enumerate(thread.lines)]


def plan_session(session: str, threads: list[Thread], harness_of) -> list[Call]:
    """The calls of one session in recorded order with their in-session dependencies (module
    docstring).

    Args:
        threads: the session's files, sorted by name.
        harness_of: ``thread name -> adapter name``.
    """
    per_thread = {t.name: _calls(t, session, harness_of(t.name)) for t in threads}
    rows = [line.get("meta", {}).get("row") if isinstance(line.get("meta"), dict) else None
            for t in threads for line in t.lines]
    if len(threads) == 1 or all(isinstance(r, int) for r in rows):
        flat = [(r, c) for r, c in zip(rows, (c for t in threads for c in per_thread[t.name]))]
        if len(threads) > 1:
            flat.sort(key=lambda rc: rc[0])
        return _chain([c for _, c in flat])
    main = next((t for t in threads if t.name.endswith("__main")), threads[0])
    subs = [t for t in threads if t is not main]
    main_calls = per_thread[main.name]
    spawn = spawn_points([c.response for c in main_calls], subs)
    out: list[Call] = []
    waiting: list[str] = []  # last call of every sub-agent thread spawned so far
    for i, call in enumerate(main_calls):
        deps = ([main_calls[i - 1].key] if i else []) + waiting
        waiting = []
        out.append(replace(call, deps=tuple(deps)))
        spawned = [per_thread[s.name] for s in spawn.get(i, [])]
        for k in range(max((len(s) for s in spawned), default=0)):
            for sub_calls in spawned:
                if k < len(sub_calls):
                    prev = sub_calls[k - 1].key if k else call.key
                    out.append(replace(sub_calls[k], deps=(prev,)))
        waiting = [s[-1].key for s in spawned]
    return out


def _chain(calls: list[Call]) -> list[Call]:
    return [replace(c, deps=(calls[i - 1].key,) if i else ()) for i, c in enumerate(calls)]


def link_sessions(sessions: list[list[Call]], independent: bool) -> list[Call]:
    """All calls in order; unless ``independent``, a session's calls without in-session
    dependencies wait for every call of the previous session."""
    out: list[Call] = []
    previous: tuple[str, ...] = ()
    for calls in sessions:
        for call in calls:
            out.append(call if call.deps or independent else replace(call, deps=previous))
        previous = tuple(c.key for c in calls)
    return out


def limit_calls(calls: list[Call], n: int | None) -> list[Call]:
    """The first ``n`` calls (all when ``n`` is None); dependencies stay inside the prefix.

    Raises:
        ValueError: ``n < 1``, or a dependency that does not point to an earlier call.
    """
    if n is not None and n < 1:
        raise ValueError(f"--limit-turns must be >= 1, got {n}")
    kept = calls if n is None else calls[:n]
    seen: set[str] = set()
    for call in kept:
        missing = [d for d in call.deps if d not in seen]
        if missing:
            raise ValueError(f"call {call.key} depends on {missing}, which are not earlier calls")
        seen.add(call.key)
    return list(kept)
