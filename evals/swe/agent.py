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
    """How the agent process ended: ``exit_code`` (None when it was killed), ``seconds`` of wall
    time, ``timed_out`` (killed at the time limit), ``interrupted`` (killed because the run was
    interrupted: Ctrl-C), and the tail of its combined output (full text in ``log``)."""

    argv: tuple[str, ...]
    exit_code: int | None
    seconds: float
    timed_out: bool
    log: Path
    output_tail: str
    interrupted: bool = False

    @property
    def killed(self) -> bool:
        """The agent did not exit by itself (time limit or interruption)."""
        return self.timed_out or self.interrupted

    @property
    def exit_status(self) -> str | None:
        """``killed (timeout)`` / ``killed (interrupted)`` when killed, else None (the harness's
        own status is in its trajectory)."""
        if self.timed_out:
            return "killed (timeout)"
        if self.interrupted:
            return "killed (interrupted)"
        return None

    @property
    def outcome(self) -> str:
        """One phrase: ``exited with code N``, ``timed out after N s``, or ``interrupted after N s``."""
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s (killed at the time limit)"
        if self.interrupted:
            return f"interrupted after {self.seconds:.0f} s (killed)"
        return f"exited with code {self.exit_code}"


def run_agent(argv: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: float) -> AgentRun:
    """Run the agent in ``cwd`` (its own process group, so a terminal's Ctrl-C does not reach
    it) with stdout+stderr to ``log``. After ``timeout`` seconds, on Ctrl-C (KeyboardInterrupt)
    and on any other exception while waiting, its whole process group gets SIGTERM, then SIGKILL
    10 s later; a Ctrl-C returns an ``AgentRun`` with ``interrupted`` set, any other exception is
    raised again once the group is gone.

    Raises:
        OSError: the executable cannot be started.
    """
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = interrupted = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except KeyboardInterrupt:
            interrupted = True
            _kill_group(proc)
        except BaseException:
            _kill_group(proc)
            raise
    seconds = time.monotonic() - started
    text = log.read_text("utf-8", "replace")
    killed = timed_out or interrupted
    return AgentRun(tuple(argv), None if killed else proc.returncode, seconds, timed_out, log, text[-4000:],
                    interrupted)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group of ``proc`` (the agent and whatever it started), up to 10 s
    for ``proc`` to exit, then SIGKILL to whatever of the group is left; reaps ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(10.0)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


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
