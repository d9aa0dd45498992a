"""mini-swe-agent (``mini``, through litellm) as the agent of a SWE run: finding it, its command
line and environment, running it under a time limit, and reading its trajectory.

Settings are the ones ``freetoken launch`` uses (``freetoken.agents.mini_swe_agent``: model name
``openai/<model>``, ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, cost-tracking errors ignored, the
bundled litellm price map, no first-run wizard), plus what keeps the run offline and contained
(``/work/shared/research/real-clients.md`` section 6): an environment built from nothing, a fresh
HOME, ``MSWEA_GLOBAL_CONFIG_DIR`` inside it, one attempt per model call
(``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1``: a failed call is reported, not retried ten times with
backoff), ``agent.step_limit`` as given, ``-y --exit-immediately`` (no confirmations).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from freetoken.agents.mini_swe_agent import mini_swe_agent_env
from freetoken.agents.target import Target

MINI_VERSION = "2.4.6"  # the version tests/clients/install.py pins
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
INSTALL_HELP = ("install it with `python -m tests.clients.install mini-swe-agent` from the repository root "
                "(a venv under ~/.cache/freetoken/clients), or `pip install mini-swe-agent`, "
                "or pass --agent-bin PATH")


class AgentNotFound(RuntimeError):
    """No usable ``mini`` executable; the message says where it looked and how to install it."""


def clients_root() -> Path:
    """``$FREETOKEN_CACHE/clients`` or ``~/.cache/freetoken/clients`` (where the client installer puts agents)."""
    cache = os.environ.get("FREETOKEN_CACHE") or str(Path.home() / ".cache" / "freetoken")
    return Path(cache) / "clients"


def find_mini(agent_bin: str | None = None) -> Path:
    """The ``mini`` executable: ``agent_bin`` when given, else the installer's cache (the pinned
    version first, then any other), else ``mini`` on PATH.

    Raises:
        AgentNotFound: ``agent_bin`` is not an executable file, or nothing was found.
    """
    if agent_bin is not None:
        path = Path(agent_bin).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise AgentNotFound(f"--agent-bin {agent_bin}: not an executable file")
        return path.absolute()
    root = clients_root()
    candidates = [root / f"mini-swe-agent-{MINI_VERSION}" / "venv" / "bin" / "mini",
                  *sorted(root.glob("mini-swe-agent-*/venv/bin/mini"), reverse=True)]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    on_path = shutil.which("mini")
    if on_path:
        return Path(on_path)
    raise AgentNotFound(f"mini-swe-agent's `mini` was not found (looked in {root}/mini-swe-agent-*/venv/bin "
                        f"and on PATH); {INSTALL_HELP}")


def mini_command(mini: Path, target: Target, task_text: str, step_limit: int, trajectory: Path,
                 home: Path, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """argv and environment of one ``mini`` run against ``target`` (the relay, when recording).

    PATH holds the folder of ``python`` (the project's interpreter, which has pytest, so the
    agent can run the task's tests as the checker will), then ``mini``'s own folder, then the
    system folders. Nothing else is inherited from the caller.
    """
    home.mkdir(parents=True, exist_ok=True)
    folders = [str(Path(python).parent), str(mini.parent), SYSTEM_PATH]
    env = {"PATH": ":".join(dict.fromkeys(folders)), "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
           "PYTHONDONTWRITEBYTECODE": "1", "MSWEA_GLOBAL_CONFIG_DIR": str(home / "mswea"),
           "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"}
    env.update(mini_swe_agent_env(target))
    argv = [str(mini), "-y", "--exit-immediately", "-t", task_text, "-c", "mini.yaml",
            "-c", f"agent.step_limit={step_limit}", "-o", str(trajectory)]
    return argv, env


@dataclass(frozen=True)
class AgentRun:
    """How the agent process ended: ``exit_code`` (None when it was killed at the time limit),
    ``seconds`` of wall time, ``timed_out``, and the tail of its combined output (full text in ``log``)."""

    argv: tuple[str, ...]
    exit_code: int | None
    seconds: float
    timed_out: bool
    log: Path
    output_tail: str


def run_agent(argv: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: float) -> AgentRun:
    """Run the agent in ``cwd`` (its own process group) with stdout+stderr to ``log``; after
    ``timeout`` seconds the group gets SIGTERM, then SIGKILL 10 s later.

    Raises:
        OSError: the executable cannot be started.
    """
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    seconds = time.monotonic() - started
    text = log.read_text("utf-8", "replace")
    return AgentRun(tuple(argv), None if timed_out else proc.returncode, seconds, timed_out, log, text[-4000:])


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass(frozen=True)
class Step:
    """One model call of the trajectory: its response id, the reply's text and reasoning text, the
    bash commands it asked for, and mini's verdict when it ran none (``interrupt`` e.g. ``FormatError``)."""

    index: int
    response_id: str | None
    content: str
    reasoning: str
    commands: tuple[str, ...]
    interrupt: str | None


@dataclass(frozen=True)
class Trajectory:
    """What mini wrote with ``-o``: ``exit_status`` (``Submitted``, ``LimitsExceeded``,
    ``RepeatedFormatError``, an exception name...), ``api_calls`` (its own count), the model steps,
    the number of messages, and the raw document."""

    exit_status: str
    api_calls: int | None
    steps: tuple[Step, ...]
    n_messages: int
    raw: dict


def read_trajectory(path: Path) -> Trajectory:
    """Parse mini's trajectory file (format ``mini-swe-agent-1.1``).

    A step is a message carrying ``extra.response`` (the litellm response object, one per model
    call): the assistant message of a parsed reply (commands in ``extra.actions[*].command``), or,
    when mini rejected the reply, its feedback message with ``extra.interrupt_type`` (e.g.
    ``FormatError``: no tool call). The step's texts are the reply's own ``message.content`` and
    ``message.reasoning_content``.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not JSON, or not an object with ``info`` and ``messages``.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("info"), dict) or not isinstance(
            data.get("messages"), list):
        raise ValueError(f"{path}: not a mini-swe-agent trajectory (no 'info' object / 'messages' list)")
    messages = [m for m in data["messages"] if isinstance(m, dict)]
    steps: list[Step] = []
    for message in messages:
        extra = message.get("extra") if isinstance(message.get("extra"), dict) else {}
        if "response" not in extra:
            continue
        response = extra["response"] if isinstance(extra["response"], dict) else {}
        choices = response.get("choices") if isinstance(response.get("choices"), list) else []
        reply = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        reply = reply if isinstance(reply, dict) else {}
        content, reasoning = reply.get("content"), reply.get("reasoning_content")
        actions = extra.get("actions") or []
        commands = tuple(str(a.get("command", "")) for a in actions if isinstance(a, dict))
        interrupt = extra.get("interrupt_type")
        steps.append(Step(len(steps), response.get("id"), content if isinstance(content, str) else "",
                          reasoning if isinstance(reasoning, str) else "", commands,
                          str(interrupt) if interrupt else None))
    stats = data["info"].get("model_stats") if isinstance(data["info"].get("model_stats"), dict) else {}
    calls = stats.get("api_calls")
    return Trajectory(str(data["info"].get("exit_status") or ""), calls if isinstance(calls, int) else None,
                      tuple(steps), len(messages), data)
