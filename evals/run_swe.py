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
random model it never does; an agent killed at ``--timeout`` is such an outcome too, reported as
``killed (timeout)``), 1 when the run hit an infrastructure failure (report still written: agent
crashed, no trajectory, an HTTP or transport error on a model call), 2 when it could not start
(bad arguments or ``--out``, endpoint unreachable, wanting a key or model unknown, no ``mini``
found, bad task), 130 on Ctrl-C (the agent's process group is killed, the temporary copy removed,
and the report written with what was recorded, status ``interrupted``).

Usage (the project's venv python): ``.venv/bin/python evals/run_swe.py --endpoint
http://127.0.0.1:8000 [--model NAME] [--step-limit 10] [--out DIR] [--timeout 1800] [--api-key KEY]
[--agent-bin PATH] [--task DIR]``. SWE-agent is not driven (not installed here); only
mini-swe-agent is.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``evals`` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evals.replay.endpoint import EndpointError, api_key_or_env, fetch_model_list, normalize_endpoint
from evals.replay.report import check_out_dir
from evals.replay.signals import EXIT_SIGINT
from evals.swe.agent import AgentNotFound, AgentRun, find_mini, mini_command, read_trajectory, run_agent
from evals.swe.relay import Relay
from evals.swe.report import build_report, render_markdown
from evals.swe.task import TASK_DIR, PytestRun, TaskError, copy_repo, load_task, run_tests, tree_diff
from freetoken.agents.discover import DiscoveryError, parse_model_list
from freetoken.agents.target import Target, resolve_target

AGENT_NAME = "mini-swe-agent"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring); argparse exits 2 on bad arguments. The
    endpoint is normalised (trailing ``/`` and ``/v1`` dropped) and the key defaults to
    ``$FREETOKEN_API_KEY``."""
    parser = argparse.ArgumentParser(prog="evals/run_swe.py",
                                     description="Run a SWE task end to end through mini-swe-agent.")
    parser.add_argument("--endpoint", required=True,
                        help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000 "
                             "(a trailing /v1 is dropped)")
    parser.add_argument("--model", default=None,
                        help="model name (default: the one GET /v1/models lists)")
    parser.add_argument("--step-limit", type=int, default=10,
                        help="agent.step_limit: model calls at most (default: 10)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: <tmp>/freetoken-swe-<timestamp>)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="wall-time limit of the agent in seconds; an agent still running then is "
                             "killed and the run reports it, exit 0 (default: 1800)")
    parser.add_argument("--api-key", default=None,
                        help="key sent to the endpoint (default: $FREETOKEN_API_KEY, else 'freetoken')")
    parser.add_argument("--agent-bin", default=None,
                        help="the `mini` executable (default: the client cache, then PATH)")
    parser.add_argument("--task", type=Path, default=TASK_DIR,
                        help="task folder with task.json (default: the bundled evals/swe_task)")
    args = parser.parse_args(argv)
    if args.step_limit < 1:
        parser.error(f"--step-limit must be at least 1 (got {args.step_limit})")
    if not args.timeout > 0 or args.timeout == float("inf"):
        parser.error(f"--timeout must be a positive number of seconds (got {args.timeout})")
    try:
        args.endpoint = normalize_endpoint(args.endpoint)
    except EndpointError as exc:
        parser.error(str(exc))
    args.api_key = api_key_or_env(args.api_key)
    return args


def _not_run(why: str) -> PytestRun:
    """The test result of a run whose tests did not run."""
    return PytestRun((), None, f"not run ({why})", {}, "")


def run(args: argparse.Namespace) -> tuple[int, Path]:
    """One SWE run; returns (exit code, output folder): 0 ok, 1 infrastructure failure, 130
    interrupted (Ctrl-C: the agent's process group is killed, the temporary copy removed, the
    report written from what was recorded). Raises the setup errors that ``main`` turns into
    exit code 2 (EndpointError, DiscoveryError, AgentNotFound, TaskError, OSError: the agent
    cannot be started or OUT cannot be written)."""
    task = load_task(args.task)
    mini = find_mini(args.agent_bin)
    served = parse_model_list(fetch_model_list(args.endpoint, args.api_key), args.endpoint, args.model)
    target, notes = resolve_target(served, args.api_key)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    out = args.out or Path(tempfile.gettempdir()) / time.strftime("freetoken-swe-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    relay = Relay(args.endpoint, timeout=args.timeout)
    relay.start()
    scratch = Path(tempfile.mkdtemp(prefix="freetoken-swe-"))
    work = scratch / "repo"
    agent: AgentRun | None = None
    trajectory, trajectory_error = None, "the agent was not run"
    diff, changed, tests = "", [], _not_run("the run was interrupted")
    interrupted = False
    try:
        try:
            copy_repo(task, work)
            via_relay = Target(relay.base_url, target.model, target.api_key, target.context_window,
                               target.max_output_tokens)
            trajectory_path = scratch / "trajectory.json"
            argv, env = mini_command(mini, via_relay, task.prompt(), args.step_limit, trajectory_path,
                                     scratch / "home")
            print(f"running {AGENT_NAME} ({mini}) on {task.name} against {args.endpoint} "
                  f"(model {target.model}, step limit {args.step_limit}) ...", file=sys.stderr)
            agent = run_agent(argv, env, work, out / "agent.log", args.timeout)
            interrupted = agent.interrupted
            relay.stop()
            try:
                trajectory = read_trajectory(trajectory_path)
                shutil.copyfile(trajectory_path, out / "trajectory.json")
                trajectory_error = None
            except (OSError, ValueError) as exc:
                trajectory_error = f"{type(exc).__name__}: {exc}"
            diff, changed = tree_diff(task.repo, work)
            if not interrupted:
                tests = run_tests(sys.executable, work, task.suite + task.failing_tests)
        except KeyboardInterrupt:
            interrupted = True
    finally:
        relay.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    if agent is None:  # interrupted before the agent started
        agent = AgentRun((str(mini),), None, 0.0, False, out / "agent.log", "", interrupted=True)
    report = build_report(task=task, endpoint=args.endpoint, model=target.model, step_limit=args.step_limit,
                          agent_name=AGENT_NAME, agent=agent, trajectory=trajectory,
                          trajectory_error=trajectory_error, calls=list(relay.calls), diff=diff,
                          changed=changed, tests=tests, interrupted=interrupted)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    (out / "patch.diff").write_text(diff, encoding="utf-8")
    tot = report["totals"]
    print(f"{task.name}: harness exit status {report['agent']['exit_status']!r} ({agent.outcome}), "
          f"{tot['model_calls']} model calls, resolved: {report['tests']['resolved']}, run: "
          f"{report['status']}; report: {out / 'report.md'}", file=sys.stderr)
    for error in report["infrastructure_errors"]:
        print(f"infrastructure error: {error}", file=sys.stderr)
    if interrupted:
        print(f"interrupted: the agent was stopped and its temporary copy removed; partial report in {out}",
              file=sys.stderr)
        return EXIT_SIGINT, out
    return (0 if report["ok"] else 1), out


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 run worked, 1 infrastructure failure during the run, 2 could not start,
    130 interrupted."""
    args = parse_args(argv)
    try:
        if args.out is not None:
            check_out_dir(args.out)
        code, _ = run(args)
    except (EndpointError, DiscoveryError, AgentNotFound, TaskError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted before the agent started; nothing written", file=sys.stderr)
        return EXIT_SIGINT
    return code


if __name__ == "__main__":
    sys.exit(main())
