"""The four workloads (W1-W4) as replay plans built from a traces folder.

=====  ==========================================================  ==========  ==============
name   trace folders (file order)                                  protocol    harness edits
=====  ==========================================================  ==========  ==============
W1     ``W1_math_aime`` (every problem an independent session)     openai      none (generic)
W2     ``W2_coding_agent_swebench``, ``W2_coding_agent_opencode``,  openai      by file name:
       ``W2_coding_agent_other``                                                ``sweagent_*``
                                                                               swe_agent,
                                                                               ``minisweagent_*``
                                                                               mini_swe_agent,
                                                                               ``opencode_*``
                                                                               opencode
W3     ``W3_claude_code``, sessions with the most sub-agent         anthropic   claude_code
       threads first (the orchestrator session leads: 5 Task
       sub-agents in two fan-outs, 3 side by side then 2)
W4     the 13-turn session assembled by :mod:`evals.replay.w4`      openai      openclaw
=====  ==========================================================  ==========  ==============

Within a folder, files are taken by name; ``select`` keeps only sessions whose name contains one
of the given substrings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evals.replay.traces import Call, Thread, limit_calls, link_sessions, load_thread, plan_session

WORKLOADS = ("W1", "W2", "W3", "W4")
DEFAULT_PROTOCOL = {"W1": "openai", "W2": "openai", "W3": "anthropic", "W4": "openai"}


@dataclass(frozen=True)
class WorkloadSpec:
    """Where a workload's traces live and how they are replayed.

    Attributes:
        name: ``"W1"`` .. ``"W4"``.
        folders: trace folders under the traces root, in replay order.
        independent: sessions do not wait for each other (W1's single-turn problems).
        by_subagents: order sessions by number of sub-agent threads, most first (W3).
    """

    name: str
    folders: tuple[str, ...]
    independent: bool = False
    by_subagents: bool = False


SPECS = {
    "W1": WorkloadSpec("W1", ("W1_math_aime",), independent=True),
    "W2": WorkloadSpec("W2", ("W2_coding_agent_swebench", "W2_coding_agent_opencode",
                              "W2_coding_agent_other")),
    "W3": WorkloadSpec("W3", ("W3_claude_code",), by_subagents=True),
    "W4": WorkloadSpec("W4", ("W4_openclaw_assistant", "W4_fixtures")),
}


def harness_for(workload: str, thread: str) -> str:
    """The harness adapter whose edits the replay applies to ``thread`` of ``workload``."""
    if workload == "W3":
        return "claude_code"
    if workload == "W4":
        return "openclaw"
    if workload == "W2":
        for prefix, name in (("minisweagent_", "mini_swe_agent"), ("sweagent_", "swe_agent"),
                             ("opencode_", "opencode")):
            if thread.startswith(prefix):
                return name
    return "generic"


def _sessions(spec: WorkloadSpec, root: Path, select: tuple[str, ...]) -> list[list[Thread]]:
    folders = [root / f for f in spec.folders if (root / f).is_dir()]
    if not folders:
        raise FileNotFoundError(f"{spec.name}: none of {', '.join(spec.folders)} under {root}")
    sessions: dict[str, list[Thread]] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.jsonl")):
            name = path.stem.split("__")[0]
            if select and not any(s in name for s in select):
                continue
            sessions.setdefault(name, []).append(load_thread(path))
    groups = list(sessions.values())
    if spec.by_subagents:
        groups.sort(key=lambda ts: -sum("__subagent" in t.name for t in ts))
    return groups


def _w1_sessions(threads: list[list[Thread]]) -> list[list[Call]]:
    out = []
    for group in threads:
        for thread in group:
            for i, line in enumerate(thread.lines):
                key = f"{thread.name}#{i}"
                out.append([Call(key, key, thread.name, i, "openai", "generic",
                                 line["messages"], line.get("tools"), line.get("response"))])
    return out


def build_plan(workload: str, root: Path, *, limit: int | None = None,
               select: tuple[str, ...] = ()) -> list[Call]:
    """The calls of ``workload`` under the traces folder ``root``, in replay order, with their
    dependencies, cut to the first ``limit``.

    Raises:
        ValueError: unknown workload, bad ``limit``, or nothing selected.
        FileNotFoundError: the workload's folders are missing under ``root``.
    """
    if workload not in SPECS:
        raise ValueError(f"unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)}")
    spec = SPECS[workload]
    if workload == "W4":
        from evals.replay.w4 import assemble_w4

        calls = assemble_w4(root)
    else:
        groups = _sessions(spec, root, select)
        if workload == "W1":
            sessions = _w1_sessions(groups)
        else:
            sessions = [plan_session(g[0].name.split("__")[0], g,
                                     lambda t: harness_for(workload, t)) for g in groups]
        calls = link_sessions(sessions, spec.independent)
    if not calls:
        raise ValueError(f"{workload}: no calls selected under {root}"
                         + (f" (--select {' '.join(select)})" if select else ""))
    return limit_calls(calls, limit)
