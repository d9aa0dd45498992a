"""``freetoken ctl memory|metrics`` against a live server on a FakeEngine (and a closed port)."""

from __future__ import annotations

import re
import socket

import pytest

from freetoken.cli import main
from freetoken.ctl import format_bytes
from freetoken.server.metrics import render_metrics

from tests.server.srv_moe import MIB, FakeMoe

NO_RUNTIME = (
    "this server has no offloaded MoE runtime (resident backend: every expert stays on the "
    "device), so there is no expert cache to resize; start it with --moe-backend offload, cpu "
    "or hybrid"
)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch) -> None:
    monkeypatch.delenv("FREETOKEN_URL", raising=False)
    monkeypatch.delenv("FREETOKEN_API_KEY", raising=False)


def _ctl(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["ctl", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("num_bytes", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536 * MIB, "1.50 GiB"),
    (5 * 2**40, "5.00 TiB"), (2**50, "1024.00 TiB"),
])
def test_format_bytes(num_bytes, text) -> None:
    assert format_bytes(num_bytes) == text


def test_memory_shows_the_cache(srv, capsys) -> None:
    assert _ctl(capsys, "memory", "--server", srv.base_url) == (
        0, "backend: resident (no expert cache: every expert stays on the device)\n", "")
    srv.engine.moe = moe = FakeMoe(slots=96)
    moe.pending = 2 * 2**30
    assert _ctl(capsys, "memory", "--server", srv.base_url + "/") == (0, (
        "backend: hybrid (policy lru, device cuda:0)\n"
        "expert cache: 96 slots x 16.00 MiB = 1.50 GiB (of 4096 experts)\n"
        "host banks: 64.00 GiB (pinned)\n"
        "expert format: dense, CPU kernel activations fp32\n"
        "pending resize: 2.00 GiB\n"), "")


def test_memory_shows_the_floor_and_warns_that_it_wins_over_a_resize(srv, capsys) -> None:
    srv.engine.moe = moe = FakeMoe(slots=96)
    moe.floor, moe.expert_format, moe.cpu_activations = 3 * 2**30, "q4g", "q8"
    assert _ctl(capsys, "memory", "--server", srv.base_url) == (0, (
        "backend: hybrid (policy lru, device cuda:0)\n"
        "expert cache: 96 slots x 16.00 MiB = 1.50 GiB (of 4096 experts)\n"
        "host banks: 64.00 GiB (pinned)\n"
        "expert format: q4g, CPU kernel activations q8\n"
        "memory floor: 3.00 GiB kept free (the cache shrinks when free memory drops below it)\n"),
        "")
    assert _ctl(capsys, "memory", "--server", srv.base_url, "--expert-cache", "2.5GiB") == (0, (
        "expert cache: 96 -> 160 slots (1.50 GiB -> 2.50 GiB), kept 96 experts\n"
        "note: a memory floor of 3.00 GiB is set: the watcher shrinks the cache again when free "
        "memory is below it at its next check\n"), "")


def test_memory_resizes(srv, capsys, monkeypatch) -> None:
    srv.engine.moe = moe = FakeMoe(slots=96)
    monkeypatch.setenv("FREETOKEN_URL", srv.base_url)
    assert _ctl(capsys, "memory", "--expert-cache", "2.5GiB") == (
        0, "expert cache: 96 -> 160 slots (1.50 GiB -> 2.50 GiB), kept 96 experts\n", "")
    assert _ctl(capsys, "memory", "--expert-cache", "48MiB") == (
        0, "expert cache: 160 -> 3 slots (2.50 GiB -> 48.00 MiB), kept 3 experts\n", "")
    assert moe.resizes == [5 * 2**29, 48 * MIB]


def test_server_errors_are_one_line_and_exit_1(srv, capsys) -> None:
    assert _ctl(capsys, "memory", "--server", srv.base_url, "--expert-cache", "1GiB") == (
        1, "", f"freetoken ctl: error: server answered 409: {NO_RUNTIME}\n")
    assert _ctl(capsys, "memory", "--server", srv.base_url + "/nope") == (
        1, "", "freetoken ctl: error: server answered 404: Invalid URL (GET "
               "/nope/v1/freetoken/memory)\n")
    srv.assert_healthy()


def test_api_key_from_flag_or_environment(make_server, capsys, monkeypatch) -> None:
    served = make_server(api_key="s3cret")
    served.engine.moe = FakeMoe(slots=4)
    missing = ("freetoken ctl: error: server answered 401: missing API key: send "
               "'Authorization: Bearer <key>' or 'x-api-key: <key>'\n")
    assert _ctl(capsys, "memory", "--server", served.base_url) == (1, "", missing)
    assert _ctl(capsys, "metrics", "--server", served.base_url, "--api-key", "bad") == (
        1, "", "freetoken ctl: error: server answered 401: invalid API key\n")
    code, out, _ = _ctl(capsys, "memory", "--server", served.base_url, "--api-key", "s3cret")
    assert code == 0 and out.splitlines()[1].startswith("expert cache: 4 slots x 16.00 MiB")
    monkeypatch.setenv("FREETOKEN_API_KEY", "s3cret")
    assert _ctl(capsys, "memory", "--server", served.base_url, "--expert-cache", "80MiB") == (
        0, "expert cache: 4 -> 5 slots (64.00 MiB -> 80.00 MiB), kept 4 experts\n", "")


def test_metrics_prints_the_page(srv, capsys) -> None:
    srv.engine.moe = moe = FakeMoe()
    code, out, err = _ctl(capsys, "metrics", "--server", srv.base_url)
    assert (code, err) == (0, "")
    sessions = srv.live.server.config.app.state.freetoken.sessions.metrics()
    assert out == render_metrics(srv.engine.counters(), moe.stats(), sessions=sessions)


def test_unreachable_server(capsys) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    code, out, err = _ctl(capsys, "memory", "--server", f"http://127.0.0.1:{port}")
    assert (code, out) == (1, "")
    assert re.fullmatch(rf"freetoken ctl: error: cannot reach the server at "
                        rf"http://127\.0\.0\.1:{port} \(.*[Cc]onnection refused.*\)\n", err), err
    code, _, err = _ctl(capsys, "metrics", "--server", f"127.0.0.1:{port}")  # http:// implied
    assert code == 1 and err.startswith("freetoken ctl: error: cannot reach the server at "
                                        f"http://127.0.0.1:{port} (")
    code, _, err = _ctl(capsys, "metrics", "--server", "ftp://127.0.0.1:1")
    assert (code, err) == (1, "freetoken ctl: error: cannot reach the server at ftp://127.0.0.1:1 "
                              "(Request URL has an unsupported protocol 'ftp://'.)\n")


def test_bad_size_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["ctl", "memory", "--expert-cache", "lots"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "freetoken ctl memory: error: argument --expert-cache: invalid size 'lots': expected a "
        "number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 2GiB")
