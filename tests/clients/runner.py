"""Run one real client against the live server and judge the run from the wire, the server log and
the client's own output.

Every run is recorded: the relay (``tap.Tap``) gives each request (method, path, body size, stream
flag, model) and its response; ``SUMMARIES`` collects a short text per run, printed at the end of the
pytest session; the full exchanges, client output and server log slice are written to the artifacts
folder for post-mortems.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .protocol import problems, sse_events
from .server import ACCESS_LINE, FINISHED_LINE, SERVER_FAULTS, ServerProcess
from .tap import Exchange, Tap

SUMMARIES: list[str] = []

MODEL_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
               "/v1/responses")
# Markers of an API/transport failure as the clients and their SDKs print them. Free-text "error" is
# not among them: the tiny model's random text (trained on Python sources) often contains it.
API_ERROR_MARKERS = re.compile(
    r"API Error|APIError|APIConnectionError|APIStatusError|AI_APICallError|AI_RetryError|BadRequestError|"
    r"InternalServerError|ServiceUnavailableError|invalid_request_error|overloaded_error|"
    r"status code [45]\d\d|\bHTTP [45]\d\d\b|\b(?:400|401|403|404|413|422|429|500|502|503) "
    r"(?:Bad Request|Unauthorized|Forbidden|Not Found|Payload Too Large|Unprocessable|Too Many|Internal Server)|"
    r"ECONNREFUSED|ECONNRESET|socket hang up|Connection refused|Unable to connect|Traceback \(most recent")


@dataclass
class ClientRun:
    """The outcome of one client process: exit code, output, wall seconds, and what went over the wire."""

    label: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    exchanges: list[Exchange]
    server_log: str
    exited: float = 0.0  # time.monotonic() when the client process had exited

    def model_calls(self) -> list[Exchange]:
        """The POSTs to the model endpoints, in order."""
        return [ex for ex in self.exchanges if ex.method == "POST" and ex.path in MODEL_PATHS]


def run_client(label: str, argv: list[str], env: dict[str, str], cwd: Path, server: ServerProcess, tap: Tap,
               artifacts: Path, timeout: float = 300.0) -> ClientRun:
    """Run ``argv`` (with exactly ``env``, as ``env -i`` would) and record the run.

    Raises:
        subprocess.TimeoutExpired: the client ran longer than ``timeout`` seconds.
    """
    mark, offset = tap.mark(), server.log_size()
    started = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    exited = time.monotonic()
    seconds = exited - started
    deadline = time.monotonic() + 5  # let the relay see the last bytes of a response the client closed early
    while time.monotonic() < deadline and not all(ex.complete for ex in tap.since(mark)):
        time.sleep(0.05)
    time.sleep(0.2)  # the access-log line of the last request
    run = ClientRun(label, proc.returncode, proc.stdout.decode("utf-8", "replace"),
                    proc.stderr.decode("utf-8", "replace"), seconds, tap.since(mark), server.log_since(offset),
                    exited)
    SUMMARIES.append(summarize(run))
    save_artifacts(run, artifacts)
    return run


def response_id(ex: Exchange) -> str | None:
    """The completion/message/response id the server put in a response (streamed or not)."""
    text = ex.response_text()
    try:
        if "text/event-stream" in ex.response_headers.get("content-type", ""):
            for _, data in sse_events(text):
                if data != "[DONE]":
                    obj = json.loads(data)
                    return (obj.get("id") or (obj.get("message") or {}).get("id")
                            or (obj.get("response") or {}).get("id"))
            return None
        return json.loads(text).get("id")
    except ValueError:
        return None


def prompt_tokens(run: ClientRun) -> dict[str, int]:
    """``{response id: prompt tokens}`` from the engine's per-request log lines in this run's log slice."""
    return {m["id"]: int(m["prompt"]) for m in FINISHED_LINE.finditer(run.server_log)}


def summarize(run: ClientRun) -> str:
    """A few lines: exit code, time, then one line per request (method, target, status, body size,
    stream flag, model, prompt tokens as the server counted them, seconds) and the body's keys."""
    tokens = prompt_tokens(run)
    lines = [f"{run.label}: exit {run.returncode} in {run.seconds:.1f}s, {len(run.exchanges)} requests"]
    for ex in run.exchanges:
        body = ex.request_json()
        extra = ""
        if isinstance(body, dict):
            counts = {k: len(v) for k, v in body.items() if k in ("messages", "tools") and isinstance(v, list)}
            keys = ",".join(f"{k}[{counts[k]}]" if k in counts else k for k in body)
            extra = f"\n      keys: {keys}"
        rid = response_id(ex)
        prompt = f" prompt={tokens[rid]}tok" if rid in tokens else ""
        lines.append(f"    {ex.method} {ex.target} -> {ex.status} body={ex.request_size}B stream={ex.stream} "
                     f"model={ex.model}{prompt} {ex.seconds or 0:.1f}s{extra}")
    return "\n".join(lines)


def _safe_text(ex: Exchange) -> str:
    try:
        return ex.response_text()
    except (ValueError, OSError, EOFError) as exc:  # undecodable encoding or truncated gzip
        return f"<{exc}> {ex.response_body[:2000]!r}"


def save_artifacts(run: ClientRun, folder: Path) -> None:
    """Write ``<label>.exchanges.jsonl``, ``.stdout``, ``.stderr`` and ``.server.log`` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", run.label)
    with open(folder / f"{stem}.exchanges.jsonl", "w") as handle:
        for ex in run.exchanges:
            handle.write(json.dumps({
                "method": ex.method, "target": ex.target, "request_headers": ex.request_headers,
                "request_body": ex.request_body.decode("utf-8", "replace"), "status": ex.status,
                "response_headers": ex.response_headers, "response_body": _safe_text(ex),
                "seconds": ex.seconds}) + "\n")
    (folder / f"{stem}.stdout").write_text(run.stdout)
    (folder / f"{stem}.stderr").write_text(run.stderr)
    (folder / f"{stem}.server.log").write_text(run.server_log)


ABANDON_GRACE_S = 1.0  # a connection closed this close to the client's exit was closed by the exit


def run_problems(run: ClientRun) -> dict[str, list[str]]:
    """``protocol.problems`` of every exchange of the run, keyed ``"METHOD target #i"``, except a
    response the client abandoned as it exited (it hung up within ``ABANDON_GRACE_S`` of its own
    exit, e.g. OpenCode's title request still streaming when its turn ended): the server did not
    fail it. A response abandoned earlier (a client giving up on a slow or stuck stream) counts."""
    bad = {}
    for i, ex in enumerate(run.exchanges):
        if not ex.complete and ex.abandoned is not None and ex.abandoned >= run.exited - ABANDON_GRACE_S:
            continue
        found = problems(ex)
        if found:
            bad[f"{ex.method} {ex.target} #{i}"] = found
    return bad


def assert_clean_run(run: ClientRun, tap: Tap, *, paths: set[str], model: str, min_calls: int = 1) -> None:
    """The checks every client shares.

    The client exited 0 and printed no API/transport error marker; it made at least ``min_calls``
    model calls, all to ``paths`` and naming ``model``; every response was complete, 200 and sound
    (``protocol.problems``); the relay parsed everything; the server logged every call as 200 in
    its access log and logged no traceback or ERROR line (``run_problems``: a response the
    client abandoned as it exited is not the server's).
    """
    where = f"{run.label}\n{summarize(run)}\n--- stdout tail:\n{run.stdout[-3000:]}\n--- stderr tail:\n" \
            f"{run.stderr[-3000:]}\n--- server log:\n{run.server_log[-3000:]}"
    assert run.returncode == 0, f"exit code {run.returncode}: {where}"
    marker = API_ERROR_MARKERS.search(run.stdout + "\n" + run.stderr)
    assert marker is None, f"API error marker {marker.group(0)!r} in client output: {where}"
    calls = run.model_calls()
    assert len(calls) >= min_calls, f"expected >= {min_calls} model calls, saw {len(calls)}: {where}"
    assert {ex.path for ex in calls} <= paths, f"calls outside {sorted(paths)}: {where}"
    assert all(ex.model == model for ex in calls), f"a call did not name model {model!r}: {where}"
    bad = run_problems(run)
    assert not bad, f"protocol problems {bad}: {where}"
    assert not tap.errors, f"relay could not parse the traffic: {tap.errors}"
    fault = SERVER_FAULTS.search(run.server_log)
    assert fault is None, f"server logged {fault.group(0)!r}: {where}"
    access = [(m["method"], m["target"], m["status"]) for m in ACCESS_LINE.finditer(run.server_log)
              if m["method"] == "POST"]
    wire = [("POST", ex.target, "200") for ex in calls]
    assert sorted(access) == sorted(wire), f"server access log {access} != wire {wire}: {where}"
