"""``freetoken launch`` waits while the server loads its model (``GET /health`` 503 loading), shows
the progress, and gives up with one line on a failed load, a vanished server or a timeout."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from freetoken.agents import ready
from freetoken.agents.discover import DiscoveryError
from freetoken.agents.ready import Health, describe_progress, wait_until_loaded
from freetoken.cli import main

SERVER = "http://127.0.0.1:1"
CARD = {"id": "moe-test", "object": "model", "max_model_len": 4096, "max_tokens": 256}


def loading(stage: str, done: int | None = None, total: int | None = None,
            elapsed: float = 1.0) -> Health:
    fraction = None if done is None or not total else done / total
    return Health(503, {"status": "loading", "progress": {
        "stage": stage, "elapsed_s": elapsed, "done_bytes": done, "total_bytes": total,
        "fraction": fraction}})


class Script:
    """A scripted ``fetch`` with a fake clock that each ``sleep`` advances."""

    def __init__(self, answers: list[Health | None]) -> None:
        self.answers = list(answers)
        self.now = 0.0
        self.sleeps: list[float] = []
        self.shown: list[tuple[str, bool]] = []

    def fetch(self, server: str) -> Health | None:
        assert server == SERVER
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def wait(self, timeout: float = 600.0) -> None:
        wait_until_loaded(SERVER, timeout, show=lambda line, last: self.shown.append((line, last)),
                          fetch=self.fetch, sleep=self.sleep, clock=lambda: self.now)


def test_waits_through_the_stages_then_returns() -> None:
    s = Script([loading("tokenizer", elapsed=0.4), loading("weights", 3 * 2**20, 12 * 2**20, 2.0),
                loading("engine", 12 * 2**20, 12 * 2**20, 4.2), Health(200, {"status": "ok"})])
    s.wait()
    assert s.shown == [("tokenizer, 0 s", False),
                       ("weights 25% (3.00 MiB of 12.00 MiB), 2 s", False),
                       ("engine 100% (12.00 MiB of 12.00 MiB), 4 s", False),
                       ("loaded", True)]
    assert s.sleeps == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("answer", [Health(200, {"status": "ok"}), Health(404, None),
                                    Health(503, {"status": "unhealthy"}), None])
def test_a_server_that_is_not_loading_is_not_waited_for(answer) -> None:
    s = Script([answer])
    s.wait()  # discovery reports whatever is wrong with it
    assert (s.shown, s.sleeps) == ([], [])


def test_a_failed_load_is_the_servers_error() -> None:
    s = Script([loading("weights", 10, 100),
                Health(503, {"status": "failed", "error": "cannot load /m: truncated"})])
    with pytest.raises(DiscoveryError) as info:
        s.wait()
    assert str(info.value) == (f"the server at {SERVER} failed to load its model: "
                               "cannot load /m: truncated")
    assert s.shown == [("weights 10% (10 B of 100 B), 1 s", False), ("failed", True)]  # not "loaded"


def test_a_server_that_goes_away_while_loading() -> None:
    s = Script([loading("weights", 10, 100), None])
    with pytest.raises(DiscoveryError) as info:
        s.wait()
    assert str(info.value) == (f"the server at {SERVER} stopped answering while it loaded its "
                               "model; see its log")
    assert s.shown[-1] == ("failed", True)


def test_gives_up_after_the_timeout() -> None:
    s = Script([loading("experts", 100, 100, elapsed=7.0)])
    with pytest.raises(DiscoveryError) as info:
        s.wait(timeout=3.0)
    assert str(info.value) == (f"the server at {SERVER} is still loading its model after 3 s "
                               "(experts 100% (100 B of 100 B), 7 s); wait longer with --wait "
                               "SECONDS")
    assert s.sleeps == [1.0, 1.0, 1.0]


def test_describe_progress_without_bytes_or_time() -> None:
    assert describe_progress({}) == "starting"
    assert describe_progress({"stage": "profile", "done_bytes": None, "total_bytes": None}) == (
        "profile")


class _Loading(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        if self.path == "/health":
            status, body = self.server.health.pop(0) if self.server.health else (200, {"status": "ok"})
        else:
            status, body = 200, {"object": "list", "data": [CARD]}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # noqa: ANN002 - silence the fake
        pass


@pytest.fixture
def fake_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadingHTTPServer]:
    """A FreeToken look-alike whose ``/health`` answers ``health`` in turn (then 200)."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy", "FREETOKEN_URL", "FREETOKEN_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ready, "POLL_INTERVAL_S", 0.01)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Loading)
    httpd.health = []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _url(httpd: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def test_launch_waits_for_a_loading_server(fake_server, capsys) -> None:
    fake_server.health = [(503, loading("weights", 1, 4).body),
                          (503, loading("weights", 4, 4, 2.0).body),
                          (503, loading("engine", 4, 4, 3.0).body)]
    url = _url(fake_server)
    assert main(["launch", "claude", "--server", url, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert f"# server {url}, model moe-test, context 4096 tokens, output 256 tokens" in out
    # not a terminal: one line per stage, then "loaded"
    assert err == ("freetoken launch: waiting for the server to load its model: weights 25% "
                   "(1 B of 4 B), 1 s\n"
                   "freetoken launch: waiting for the server to load its model: engine 100% "
                   "(4 B of 4 B), 3 s\n"
                   "freetoken launch: model loaded\n")
    assert fake_server.health == []


def test_launch_gives_up_on_a_failed_load(fake_server, capsys) -> None:
    fake_server.health = [(503, {"status": "failed", "error": "cannot load /m: bad"})] * 3
    url = _url(fake_server)
    assert main(["launch", "opencode", "--server", url, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"freetoken launch: error: the server at {url} failed to load its "
                              "model: cannot load /m: bad\n")


def test_launch_wait_timeout_is_one_line(fake_server, capsys) -> None:
    fake_server.health = [(503, loading("weights", 1, 4).body)] * 1000
    url = _url(fake_server)
    assert main(["launch", "claude", "--server", url, "--dry-run", "--wait", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[-1] == (
        f"freetoken launch: error: the server at {url} is still loading its model after 0 s "
        "(weights 25% (1 B of 4 B), 1 s); wait longer with --wait SECONDS")


@pytest.mark.parametrize("value", ["-5", "nan", "soon"])
def test_launch_wait_must_be_seconds(value, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["launch", "claude", "--dry-run", "--wait", value])
    assert info.value.code == 2
    assert "argument --wait: expected seconds" in capsys.readouterr().err


def test_launch_never_says_loaded_when_the_load_failed(fake_server, capsys) -> None:
    fake_server.health = [(503, loading("weights", 1, 4).body),
                          (503, {"status": "failed", "error": "cannot load /m: bad"})]
    url = _url(fake_server)
    assert main(["launch", "claude", "--server", url, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", "freetoken launch: waiting for the server to load its model: "
                              "weights 25% (1 B of 4 B), 1 s\n"
                              f"freetoken launch: error: the server at {url} failed to load its "
                              "model: cannot load /m: bad\n")
