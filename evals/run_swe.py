"""Run a SWE-style task end to end through a real agent against an endpoint, and report.

The task (``evals/swe_task``, project-written: the small ``tally`` package whose ``median`` is
wrong for even lengths, its issue text and the failing test ``test_median_even_length``) is copied
to a scratch folder; mini-swe-agent (``mini``, litellm ``openai/<model>``, non-streaming Chat
Completions) works there against the endpoint through a recording relay (``evals/swe/relay.py``).
After the agent exits, the task's suite and failing test run in the copy (one pytest run, with
this python), and the copy is diffed against the original.

Writes ``OUT/report.json``, ``OUT/report.md`` (task, agent, steps, per-call TTFT and decode tok/s,
totals, patch diff, test results, the harness's exit status and exit code), ``OUT/trajectory.json``
(mini's own), ``OUT/patch.diff`` and ``OUT/agent.log``.

Exit code: 0 when the run itself worked (whether or not the patch fixes the task: with the tiny
random model it never does), 1 when the run hit an infrastructure failure (report still written:
agent crashed or timed out, no trajectory, an HTTP or transport error on a model call), 2 when it
could not start (bad arguments, endpoint unreachable or model unknown, no ``mini`` found, bad task).

Usage: ``python evals/run_swe.py --endpoint http://127.0.0.1:8000 [--model NAME] [--step-limit 10]
[--out DIR] [--timeout 1800] [--api-key KEY] [--agent-bin PATH] [--task DIR]``. SWE-agent is not
driven (not installed here); only mini-swe-agent is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

if __package__ in (None, ""):  # run as a script: make ``evals`` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evals.swe.agent import AgentNotFound, find_mini, mini_command, read_trajectory, run_agent
from evals.swe.relay import Relay
from evals.swe.report import build_report, render_markdown
from evals.swe.task import TASK_DIR, TaskError, copy_repo, load_task, run_tests, tree_diff
from freetoken.agents.discover import DiscoveryError, discover
from freetoken.agents.target import Target, resolve_target

AGENT_NAME = "mini-swe-agent"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring); argparse exits 2 on bad arguments."""
    parser = argparse.ArgumentParser(prog="python evals/run_swe.py",
                                     description="Run a SWE task end to end through mini-swe-agent.")
    parser.add_argument("--endpoint", required=True,
                        help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000 (no /v1)")
    parser.add_argument("--model", default=None, help="model name (default: the one GET /v1/models lists)")
    parser.add_argument("--step-limit", type=int, default=10, help="agent.step_limit: model calls at most")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: <tmp>/freetoken-swe-<timestamp>)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="wall-time limit of the agent, seconds")
    parser.add_argument("--api-key", default=None, help="key sent to the endpoint (default: 'freetoken')")
    parser.add_argument("--agent-bin", default=None,
                        help="the `mini` executable (default: the client cache, then PATH)")
    parser.add_argument("--task", type=Path, default=TASK_DIR, help="task folder with task.json")
    args = parser.parse_args(argv)
    if args.step_limit < 1:
        parser.error(f"--step-limit must be at least 1 (got {args.step_limit})")
    if args.timeout <= 0:
        parser.error(f"--timeout must be positive (got {args.timeout})")
    args.endpoint = args.endpoint.rstrip("/")
    if args.endpoint.endswith("/v1"):
        args.endpoint = args.endpoint[:-3]
    parts = urlsplit(args.endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        parser.error(f"--endpoint {args.endpoint!r} is not an http:// or https:// URL with a host")
    return args


def run(args: argparse.Namespace) -> tuple[int, Path]:
    """One SWE run; returns (exit code, output folder). Raises the setup errors that ``main`` turns
    into exit code 2 (DiscoveryError, AgentNotFound, TaskError, OSError: the agent cannot be
    started or OUT cannot be written)."""
    task = load_task(args.task)
    mini = find_mini(args.agent_bin)
    target, notes = resolve_target(discover(args.endpoint, args.model, args.api_key), args.api_key)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    out = args.out or Path(tempfile.gettempdir()) / time.strftime("freetoken-swe-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    relay = Relay(args.endpoint, timeout=args.timeout)
    relay.start()
    scratch = Path(tempfile.mkdtemp(prefix="freetoken-swe-"))
    try:
        work = copy_repo(task, scratch / "repo")
        via_relay = Target(relay.base_url, target.model, target.api_key, target.context_window,
                           target.max_output_tokens)
        trajectory_path = scratch / "trajectory.json"
        argv, env = mini_command(mini, via_relay, task.prompt(), args.step_limit, trajectory_path,
                                 scratch / "home")
        print(f"running {AGENT_NAME} ({mini}) on {task.name} against {args.endpoint} "
              f"(model {target.model}, step limit {args.step_limit}) ...", file=sys.stderr)
        agent = run_agent(argv, env, work, out / "agent.log", args.timeout)
        relay.stop()
        trajectory, trajectory_error = None, None
        try:
            trajectory = read_trajectory(trajectory_path)
            shutil.copyfile(trajectory_path, out / "trajectory.json")
        except (OSError, ValueError) as exc:
            trajectory_error = f"{type(exc).__name__}: {exc}"
        diff, changed = tree_diff(task.repo, work)
        tests = run_tests(sys.executable, work, task.suite + task.failing_tests)
    finally:
        relay.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report = build_report(task=task, endpoint=args.endpoint, model=target.model, step_limit=args.step_limit,
                          agent_name=AGENT_NAME, agent=agent, trajectory=trajectory,
                          trajectory_error=trajectory_error, calls=list(relay.calls), diff=diff,
                          changed=changed, tests=tests)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    (out / "patch.diff").write_text(diff, encoding="utf-8")
    tot = report["totals"]
    print(f"{task.name}: exit status {report['agent']['exit_status']!r} (exit code {agent.exit_code}), "
          f"{tot['model_calls']} model calls, resolved: {report['tests']['resolved']}; "
          f"report: {out / 'report.md'}", file=sys.stderr)
    for error in report["infrastructure_errors"]:
        print(f"infrastructure error: {error}", file=sys.stderr)
    return (0 if report["ok"] else 1), out


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 run worked, 1 infrastructure failure during the run, 2 could not start."""
    args = parse_args(argv)
    try:
        code, _ = run(args)
    except (DiscoveryError, AgentNotFound, TaskError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
