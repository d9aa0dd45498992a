"""report.json and report.md of a SWE run: task, agent, steps, per-call timings, totals, patch,
test result and exit status, from what the relay recorded and what the agent wrote.

Per call (see ``calls.py``): TTFT and decode tok/s. mini-swe-agent calls without streaming, so
for its calls TTFT is the full response time and decode tok/s is output tokens over that time
(prefill included); streamed calls use the first generated token. Totals: ``ttft_mean_s`` /
``ttft_max_s`` over answered model calls, ``decode_tps_mean`` the per-request mean (the paper's
throughput metric), token sums from the answers' ``usage``.
"""

from __future__ import annotations

import statistics
from typing import Any

from evals.swe.agent import AgentRun, Trajectory
from evals.swe.calls import CallRecord
from evals.swe.task import PytestRun, SweTask

TIMING_NOTE = ("Non-streaming calls (mini-swe-agent's): TTFT = full response time, decode tok/s = output "
               "tokens / full response time (prefill included, a lower bound). Streaming calls: TTFT = "
               "time to the first generated token, decode tok/s = (output tokens - 1) / time after it. "
               "Times are taken at a recording relay in front of the endpoint.")
CONTENT_CHARS = 400
RUN_LINE = {"ok": "ok", "infrastructure failure": "INFRASTRUCTURE FAILURE",
            "interrupted": "INTERRUPTED (Ctrl-C): the agent was killed; this report holds what was "
                           "recorded until then"}


def totals(calls: list[CallRecord], agent_seconds: float | None) -> dict[str, Any]:
    """Sums and means over the model calls answered with a 2xx status (see the module docstring)."""
    answered = [c for c in calls if c.is_model_call and c.status is not None and 200 <= c.status < 300]
    ttfts = [c.ttft_s for c in answered if c.ttft_s is not None]
    rates = [c.decode_tps for c in answered if c.decode_tps is not None]

    def total(attr: str) -> int | None:
        values = [getattr(c, attr) for c in answered if getattr(c, attr) is not None]
        return sum(values) if values else None

    return {
        "model_calls": sum(1 for c in calls if c.is_model_call),
        "answered_2xx": len(answered),
        "prompt_tokens": total("prompt_tokens"),
        "cached_tokens": total("cached_tokens"),
        "output_tokens": total("output_tokens"),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else None,
        "ttft_max_s": max(ttfts) if ttfts else None,
        "decode_tps_mean": statistics.fmean(rates) if rates else None,
        "model_time_s": sum(c.total_s for c in answered if c.total_s is not None),
        "agent_wall_s": agent_seconds,
    }


def infrastructure_errors(agent: AgentRun, trajectory: Trajectory | None, trajectory_error: str | None,
                          calls: list[CallRecord]) -> list[str]:
    """Why the run itself did not work (empty when it did): the agent crashed (nonzero exit) or
    wrote no readable trajectory, no model call reached the endpoint, or a model call got an HTTP
    error or a transport failure. A wrong patch is not an infrastructure error, and neither is an
    agent killed at the time limit or by an interruption: then only the model calls that got a
    whole answer are checked (the call in flight at the kill is cut by it)."""
    errors = []
    if not agent.killed:
        if agent.exit_code != 0:
            errors.append(f"the agent exited with code {agent.exit_code} (see agent.log)")
        if trajectory is None:
            errors.append(f"no trajectory: {trajectory_error}")
    model_calls = [c for c in calls if c.is_model_call]
    if not model_calls and not agent.killed:
        errors.append("no model call reached the endpoint")
    for c in model_calls:
        cut = c.total_s is None or (c.error or "").startswith("client went away")
        if agent.killed and cut:
            continue
        if c.error is not None:
            errors.append(f"model call {c.index} ({c.method} {c.path}): {c.error}")
        elif c.status is None or not 200 <= c.status < 300:
            errors.append(f"model call {c.index} ({c.method} {c.path}) answered HTTP {c.status}")
    return errors


def build_report(*, task: SweTask, endpoint: str, model: str, step_limit: int, agent_name: str,
                 agent: AgentRun, trajectory: Trajectory | None, trajectory_error: str | None,
                 calls: list[CallRecord], diff: str, changed: list[str], tests: PytestRun,
                 interrupted: bool = False) -> dict[str, Any]:
    """The report.json document (plain JSON types only). ``tests`` is the pytest run over the
    task's suite and failing tests in the agent's copy; the task is resolved when the failing
    tests passed and the whole run passed.

    ``status``: ``"interrupted"`` when the run was stopped (Ctrl-C: ``agent.interrupted`` or
    ``interrupted``), else ``"ok"`` or ``"infrastructure failure"``. The harness exit status is
    the trajectory's, or ``killed (timeout)`` / ``killed (interrupted)`` when the agent was
    killed."""
    steps = list(trajectory.steps) if trajectory else []
    by_id = {s.response_id: s for s in steps if s.response_id}
    rows = []
    for c in calls:
        row = c.as_dict()
        step = by_id.get(c.response_id) if c.response_id else None
        row["step"] = step.index if step else None
        rows.append(row)
    errors = infrastructure_errors(agent, trajectory, trajectory_error, calls)
    info = trajectory.raw.get("info", {}) if trajectory else {}
    interrupted = interrupted or agent.interrupted
    status = "interrupted" if interrupted else "infrastructure failure" if errors else "ok"
    exit_status = agent.exit_status or (trajectory.exit_status if trajectory else None)
    return {
        "task": {"name": task.name, "folder": str(task.folder), "issue": task.issue,
                 "failing_tests": list(task.failing_tests), "suite": list(task.suite)},
        "endpoint": endpoint,
        "model": model,
        "step_limit": step_limit,
        "agent": {
            "name": agent_name,
            "version": info.get("mini_version"),
            "executable": agent.argv[0],
            "exit_code": agent.exit_code,
            "exit_status": exit_status,
            "outcome": agent.outcome,
            "timed_out": agent.timed_out,
            "interrupted": agent.interrupted,
            "seconds": agent.seconds,
            "api_calls": trajectory.api_calls if trajectory else None,
            "trajectory_messages": trajectory.n_messages if trajectory else None,
            "output_tail": agent.output_tail,
        },
        "steps": [{"index": s.index, "response_id": s.response_id, "commands": list(s.commands),
                   "interrupt": s.interrupt, "content": s.content[:CONTENT_CHARS],
                   "reasoning": s.reasoning[:CONTENT_CHARS]} for s in steps],
        "calls": rows,
        "totals": totals(calls, agent.seconds),
        "timing_note": TIMING_NOTE,
        "patch": {"files_changed": changed, "diff": diff},
        "tests": {"run": tests.as_dict(),
                  "failing_tests": {node: tests.outcomes.get(node, "not run") for node in task.failing_tests},
                  "failing_tests_pass": tests.all_passed(task.failing_tests), "suite_passes": tests.passed,
                  "resolved": tests.all_passed(task.failing_tests) and tests.passed},
        "infrastructure_errors": errors,
        "status": status,
        "ok": status == "ok",
    }


def _num(value: float | int | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render_markdown(report: dict[str, Any]) -> str:
    """report.md: a human-readable rendering of ``report`` (same facts, no extra ones)."""
    agent, tot, tests = report["agent"], report["totals"], report["tests"]
    lines = [f"# SWE run: {report['task']['name']}", "",
             f"- endpoint: {report['endpoint']} (model `{report['model']}`)",
             f"- agent: {agent['name']} {agent['version'] or ''} (`{agent['executable']}`), "
             f"step limit {report['step_limit']}",
             f"- harness exit status: `{agent['exit_status']}`; process exit code: "
             f"{'-' if agent['exit_code'] is None else agent['exit_code']}; the harness {agent['outcome']}",
             f"- resolved: **{'yes' if tests['resolved'] else 'no'}** (failing tests: "
             + ", ".join(f"{node.rsplit('::', 1)[-1]} {outcome}" for node, outcome in tests["failing_tests"].items())
             + f"; suite: {tests['run']['summary'] or '-'})",
             f"- run: {RUN_LINE[report['status']]}", ""]
    if report["infrastructure_errors"]:
        lines += ["## Infrastructure errors", ""] + [f"- {e}" for e in report["infrastructure_errors"]] + [""]
    lines += ["## Issue", "", report["task"]["issue"].strip(), "", "## Steps", ""]
    if not report["steps"]:
        lines.append("(no model step in the trajectory)")
    for step in report["steps"]:
        verdict = (f"ran `{'; '.join(_cell(c) for c in step['commands'])}`" if step["commands"]
                   else f"no command ({step['interrupt'] or 'none'})")
        text = f"{step['index'] + 1}. {verdict}; reply: \"{_cell(step['content'])[:160]}\""
        if step["reasoning"]:
            text += f", reasoning: \"{_cell(step['reasoning'])[:160]}\""
        lines.append(text)
    lines += ["", "## Model calls", "",
              "| # | step | status | prompt tok | cached tok | output tok | TTFT s | decode tok/s | finish "
              "| tool calls |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for c in (c for c in report["calls"] if c["model_call"]):
        step = "-" if c["step"] is None else str(c["step"] + 1)
        lines.append(f"| {c['index']} | {step} | {c['status'] if c['error'] is None else 'error'} | "
                     f"{_num(c['prompt_tokens'])} | {_num(c['cached_tokens'])} | {_num(c['output_tokens'])} | "
                     f"{_num(c['ttft_s'])} | {_num(c['decode_tps'], 1)} | {c['finish_reason'] or '-'} | "
                     f"{c['tool_calls']} |")
    lines += ["", report["timing_note"], "", "## Totals", "",
              f"- model calls: {tot['model_calls']} ({tot['answered_2xx']} answered 2xx)",
              f"- prompt tokens: {_num(tot['prompt_tokens'])} (cached {_num(tot['cached_tokens'])}), "
              f"output tokens: {_num(tot['output_tokens'])}",
              f"- TTFT mean {_num(tot['ttft_mean_s'])} s, max {_num(tot['ttft_max_s'])} s; "
              f"decode mean {_num(tot['decode_tps_mean'], 1)} tok/s",
              f"- time in model calls {_num(tot['model_time_s'], 1)} s of {_num(tot['agent_wall_s'], 1)} s "
              "agent wall time", "", "## Patch", ""]
    diff = report["patch"]["diff"]
    lines += (["```diff", diff.rstrip("\n"), "```"] if diff else ["(the agent changed no file)"])
    run = tests["run"]
    lines += ["", f"## Tests: `python {' '.join(run['args'])}` in the agent's copy", "",
              f"exit code {run['rc']}: {run['summary']}", ""]
    lines += [f"- {node}: {outcome}" for node, outcome in run["outcomes"].items()]
    return "\n".join(lines) + "\n"
