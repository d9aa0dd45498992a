"""``freetoken launch AGENT [--server URL] [--model NAME] [--api-key KEY] [--wait S] [--dry-run]
[-- ARGS...]``.

Waits while the server is still loading its model (``ready.wait_until_loaded``: a progress line on
stderr), discovers the served model, builds the agent's provider settings (``plan.plan_launch``), then either
prints them (``--dry-run``: nothing is written, nothing is started) or writes the agent's config file
into FreeToken's own config folder and replaces this process with the agent (``os.execve``), so the
agent owns the terminal, its signals and its exit status. Failures print one
``freetoken launch: error: ...`` line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from freetoken.agents.plan import AGENTS, LaunchPlan, plan_launch
from freetoken.agents.ready import DEFAULT_WAIT_S

PROG = "freetoken launch"
ERROR_STATUS = 2


class LaunchError(Exception):
    """A launch that cannot proceed; the message is one line."""


def split_agent_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(freetoken's own args, the agent's args)``: for a ``launch`` command, everything after the
    first ``--`` belongs to the agent (argparse alone cannot take options both before and after
    ``--`` next to a positional). Any other command is returned whole, with no agent args."""
    argv = list(argv)
    if argv[:1] != ["launch"] or "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def add_launch_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``launch`` sub-command on ``freetoken``'s sub-parsers."""
    p = sub.add_parser(
        "launch", help="run a coding agent against a FreeToken server",
        usage=f"{PROG} [-h] [--server URL] [--model NAME] [--api-key KEY] [--wait S] [--dry-run] "
              f"{{{','.join(sorted(AGENTS))}}} [-- ARGS...]",
        description="Point a coding agent at a FreeToken server (model, limits and timeouts from "
                    "GET /v1/models; cloud API keys removed from its environment) and start it.",
        epilog="Arguments after -- go to the agent unchanged, e.g. "
               "`freetoken launch claude -- -p 'fix the tests'`.")
    p.add_argument("agent", choices=sorted(AGENTS), help="the agent to start")
    p.add_argument("--server", default=None, metavar="URL",
                   help="server URL (default $FREETOKEN_URL or http://127.0.0.1:8000)")
    p.add_argument("--model", default=None, metavar="NAME",
                   help="served model to use (default: the only one GET /v1/models lists)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="the server's API key (default $FREETOKEN_API_KEY, else a placeholder)")
    p.add_argument("--wait", type=_seconds, default=DEFAULT_WAIT_S, metavar="S",
                   help="seconds to wait for a server still loading its model "
                        f"(default {DEFAULT_WAIT_S:.0f})")
    p.add_argument("--dry-run", action="store_true",
                   help="print the environment, config file and command; write and start nothing")


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _seconds(text: str) -> float:
    """``--wait``: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _show_load(terminal: bool) -> Callable[[str, bool], None]:
    """A ``wait_until_loaded`` progress printer: one line rewritten in place on a terminal, else
    a line per stage."""
    shown = [""]

    def show(line: str, last: bool) -> None:
        if last and line != "loaded":  # the load failed: end the progress line, the error follows
            if terminal:
                sys.stderr.write("\n")
                sys.stderr.flush()
            return
        text = "model loaded" if last else f"waiting for the server to load its model: {line}"
        if terminal:
            sys.stderr.write(f"\r{PROG}: {text}\x1b[K" + ("\n" if last else ""))
            sys.stderr.flush()
            return
        stage = line.split(" ")[0].rstrip(",")
        if last or stage != shown[0]:
            shown[0] = stage
            _say(text)

    return show


def describe(plan: LaunchPlan) -> str:
    """The dry-run text: a POSIX shell script doing what the launch does (unset the cleared
    credentials, export the settings, write the config file with a here-document, exec the agent),
    headed by comments naming the server, model and limits."""
    t = plan.target
    lines = [f"# {PROG} {plan.agent}: dry run, nothing is written or started",
             f"# server {t.base_url}, model {t.model}, context {t.context_window} tokens, "
             f"output {t.max_output_tokens} tokens"]
    lines += [f"unset {name}" for name in plan.cleared]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in plan.settings.items()]
    if plan.config_path is not None and plan.config_text is not None:
        lines.append(f"mkdir -p {shlex.quote(str(plan.config_path.parent))}")
        lines.append(f"cat > {shlex.quote(str(plan.config_path))} <<'EOF'")
        lines += [*plan.config_text.rstrip("\n").split("\n"), "EOF"]
    if not plan.executable_found:
        lines.append(f"# {plan.argv[0]} is not on PATH; install it with: {AGENTS[plan.agent].install_hint}")
    lines.append(f"exec {shlex.join(plan.argv)}")
    return "\n".join(lines) + "\n"


def write_config(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file + rename), readable by the user only (it holds
    the API key); parent folders are created as needed.

    Raises:
        OSError: the folder or file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plan(args: argparse.Namespace, agent_args: list[str], environ: Mapping[str, str]) -> LaunchPlan:
    """Discover the model and build the plan; notes about assumed limits go to stderr."""
    from freetoken.agents.discover import discover
    from freetoken.agents.ready import wait_until_loaded
    from freetoken.agents.target import resolve_target
    from freetoken.ctl import server_url

    server = server_url(args.server)
    wait_until_loaded(server, args.wait, show=_show_load(sys.stderr.isatty()))
    api_key = args.api_key or environ.get("FREETOKEN_API_KEY") or None
    target, notes = resolve_target(discover(server, args.model, api_key), api_key)
    for note in notes:
        _say(f"note: {note}")
    return plan_launch(args.agent, target, environ, agent_args)


def _exec(plan: LaunchPlan) -> None:
    """Write the config file, then replace this process with the agent.

    Raises:
        LaunchError: the executable is missing, or the config or the exec fails.
    """
    if not plan.executable_found:
        raise LaunchError(f"{plan.argv[0]!r} is not on PATH; install it with: "
                          f"{AGENTS[plan.agent].install_hint}")
    if plan.config_path is not None and plan.config_text is not None:
        try:
            write_config(plan.config_path, plan.config_text)
        except OSError as exc:
            raise LaunchError(f"cannot write {plan.config_path}: {exc.strerror or exc}") from None
    where = f", config {plan.config_path}" if plan.config_path else ""
    _say(f"{plan.agent} -> {plan.target.base_url} model {plan.target.model}{where}")
    sys.stdout.flush()
    try:
        os.execve(plan.argv[0], list(plan.argv), plan.env)
    except OSError as exc:
        raise LaunchError(f"cannot start {plan.argv[0]}: {exc.strerror or exc}") from None


def run_launch(args: argparse.Namespace, agent_args: list[str] | None = None) -> int:
    """Run ``freetoken launch`` (parsed ``args``, ``agent_args`` from after ``--``); returns the exit
    status (0 after a dry run, ``ERROR_STATUS`` on any failure; a real launch does not return)."""
    from freetoken.agents.discover import DiscoveryError

    try:
        plan = _plan(args, list(agent_args or []), os.environ)
        if args.dry_run:
            sys.stdout.write(describe(plan))
            return 0
        _exec(plan)
    except (DiscoveryError, LaunchError) as exc:
        _say(f"error: {exc}")
        return ERROR_STATUS
    return ERROR_STATUS  # not reached: execve replaced the process
