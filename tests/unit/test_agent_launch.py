"""``freetoken launch``: model discovery against a stub ``/v1/models``, each agent's exact provider
settings (dry run, with nothing written), its one-line errors (exit status 2), the ``--``
passthrough, and real launches that exec a fake agent binary which dumps what it received."""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from freetoken.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
CARD = {"id": "moe-test", "object": "model", "owned_by": "freetoken", "max_model_len": 65536,
        "max_input_tokens": 65535, "max_tokens": 2048}
SECRETS = {"ANTHROPIC_API_KEY": "sk-ant-secret-1", "OPENAI_API_KEY": "sk-openai-secret-2",
           "GEMINI_API_KEY": "gm-secret-3", "AWS_SECRET_ACCESS_KEY": "aws-secret-4",
           "OPENROUTER_API_KEY": "sk-or-secret-5", "CLAUDE_CODE_USE_BEDROCK": "1"}
SECRET_VALUES = [v for v in SECRETS.values() if len(v) > 1]  # CLAUDE_CODE_USE_BEDROCK=1 is a switch
EXECUTABLES = {"claude": "claude", "opencode": "opencode", "openclaw": "openclaw", "mini-swe-agent": "mini",
               "codex": "codex"}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        status, ctype, body = self.server.answer
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # noqa: ANN002 - silence the stub
        pass


class Stub:
    """A ``/v1/models`` server on a free loopback port; ``answer`` is (status, content type, body)."""

    def __init__(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.seen = []
        self.set_json({"object": "list", "data": [CARD]})
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def set_json(self, body: object, status: int = 200) -> None:
        self.httpd.answer = (status, "application/json", json.dumps(body).encode())

    def set_raw(self, status: int, ctype: str, body: bytes) -> None:
        self.httpd.answer = (status, ctype, body)

    @property
    def seen(self) -> list[tuple[str, str | None]]:
        return self.httpd.seen


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    thread = threading.Thread(target=server.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user whose HOME is ``tmp_path/home`` (holding their own opencode.json), with cloud keys set,
    ``tmp_path/bin`` (empty) as the whole PATH, and no FreeToken, XDG or proxy variables (so no
    clients cache but the empty ``~/.cache/freetoken/clients``)."""
    home = tmp_path / "home"
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text('{"model": "anthropic/claude-x"}\n')
    (tmp_path / "bin").mkdir()
    for name in ("FREETOKEN_URL", "FREETOKEN_API_KEY", "FREETOKEN_CACHE", "XDG_CONFIG_HOME", "NO_PROXY", "no_proxy",
                 "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("MY_SETTING", "kept")
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


def _fake_agent(bin_dir: Path, name: str, dump: Path) -> Path:
    """An executable ``bin_dir/name`` that dumps its pid, argv, environment and the config file the
    environment points at into ``dump`` (JSON), then exits 7."""
    script = bin_dir / name
    script.write_text(f"""#!{sys.executable}
import json, os, sys
path = os.environ.get("OPENCODE_CONFIG") or os.environ.get("OPENCLAW_CONFIG_PATH")
config = open(path).read() if path else None
with open({str(dump)!r}, "w") as handle:
    json.dump({{"pid": os.getpid(), "argv": sys.argv, "env": dict(os.environ), "config": config}}, handle)
sys.exit(7)
""")
    script.chmod(0o755)
    return script


def _parse_dry_run(text: str) -> dict:
    """The dry-run script, taken apart: comments, unset names, exported values, the here-document
    (path and parsed JSON) and the exec argv."""
    out: dict = {"comments": [], "unset": [], "export": {}, "mkdir": None, "config_path": None,
                 "config": None, "argv": None}
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("#"):
            out["comments"].append(line)
        elif line.startswith("unset "):
            out["unset"].append(line.removeprefix("unset "))
        elif line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            out["export"][name] = shlex.split(value)[0] if value else ""
        elif line.startswith("mkdir -p "):
            out["mkdir"] = shlex.split(line)[2]
        elif line.startswith("cat > "):
            out["config_path"] = shlex.split(line.removesuffix(" <<'EOF'"))[2]
            body = []
            for inner in lines:
                if inner == "EOF":
                    break
                body.append(inner)
            out["config"] = json.loads("\n".join(body))
        elif line.startswith("exec "):
            out["argv"] = shlex.split(line.removeprefix("exec "))
        else:
            raise AssertionError(f"unexpected dry-run line {line!r}")
    return out


def _dry_run(agent: str, stub: Stub, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[dict, str]:
    code = main(["launch", agent, "--server", stub.url, "--dry-run", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    for secret in SECRET_VALUES:
        assert secret not in out, f"cloud secret leaked into the dry run: {secret}"
    return _parse_dry_run(out), err


def _claude_env(url: str, token: str = "freetoken") -> dict[str, str]:
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": token, "ANTHROPIC_API_KEY": ""}
    env.update({k: "moe-test" for k in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL",
                                        "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                                        "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")})
    env.update({"CLAUDE_CODE_ATTRIBUTION_HEADER": "0", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1", "API_TIMEOUT_MS": "3600000", "CLAUDE_STREAM_IDLE_TIMEOUT_MS": "1800000",
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "2048", "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "65536"})
    return env


def _opencode_config(url: str) -> dict:
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"freetoken": {
            "npm": "@ai-sdk/openai-compatible", "name": "FreeToken",
            "options": {"baseURL": f"{url}/v1", "apiKey": "freetoken", "timeout": 1800000, "chunkTimeout": 600000},
            "models": {"moe-test": {"name": "moe-test (FreeToken)", "tool_call": True,
                                    "limit": {"context": 65536, "output": 2048}}},
        }},
        "model": "freetoken/moe-test", "small_model": "freetoken/moe-test",
    }


def _openclaw_config(url: str) -> dict:
    return {
        "telemetry": {"enabled": False},
        "agents": {"defaults": {"model": {"primary": "freetoken/moe-test"}}},
        "models": {"mode": "merge", "providers": {"freetoken": {
            "baseUrl": f"{url}/v1", "apiKey": "freetoken", "api": "openai-completions", "timeoutSeconds": 1800,
            "models": [{"id": "moe-test", "name": "moe-test (FreeToken)", "reasoning": True, "input": ["text"],
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                        "contextWindow": 65536, "maxTokens": 2048}],
        }}},
    }


def _mini_env(url: str) -> dict[str, str]:
    return {"MSWEA_MODEL_NAME": "openai/moe-test", "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": "freetoken",
            "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "MSWEA_CONFIGURED": "true"}


CLEARED = ["CLAUDE_CODE_USE_BEDROCK", "OPENAI_API_KEY", "GEMINI_API_KEY", "AWS_SECRET_ACCESS_KEY",
           "OPENROUTER_API_KEY"]


def _codex_overrides(url: str) -> list[str]:
    """Codex's provider as ``-c`` overrides: 65536 context less the 2048 output cap is the
    auto-compaction limit."""
    pairs = [
        'model="moe-test"', 'model_provider="freetoken"',
        'model_providers.freetoken.name="FreeToken"',
        f'model_providers.freetoken.base_url="{url}/v1"',
        'model_providers.freetoken.wire_api="responses"',
        'model_providers.freetoken.env_key="FREETOKEN_API_KEY"',
        "model_providers.freetoken.stream_idle_timeout_ms=1800000",
        "model_context_window=65536", "model_auto_compact_token_limit=63488",
        'web_search="disabled"', "analytics.enabled=false",
    ]
    return [arg for pair in pairs for arg in ("-c", pair)]


def _lead(agent: str, settings: dict[str, str], url: str = "") -> list[str]:
    """Arguments launch puts before the user's: Claude Code's settings again as ``--settings``
    (they rank above the user's own ~/.claude/settings.json), Codex's provider overrides."""
    if agent == "codex":
        return _codex_overrides(url)
    return ["--settings", json.dumps({"env": settings}, separators=(",", ":"))] if agent == "claude" else []


def _expected(agent: str, url: str, home: Path) -> tuple[dict[str, str], list[str], Path | None, dict | None]:
    """(exported settings, cleared names, config path, config document) a launch of ``agent`` must use."""
    launch_dir = home / ".config" / "freetoken" / "launch" / agent
    if agent == "claude":
        return _claude_env(url), CLEARED, None, None
    if agent == "opencode":
        path = launch_dir / "opencode.json"
        return {"OPENCODE_CONFIG": str(path)}, ["ANTHROPIC_API_KEY", *CLEARED], path, _opencode_config(url)
    if agent == "openclaw":
        path = launch_dir / "openclaw.json"
        return {"OPENCLAW_CONFIG_PATH": str(path)}, ["ANTHROPIC_API_KEY", *CLEARED], path, _openclaw_config(url)
    if agent == "codex":
        return {"FREETOKEN_API_KEY": "freetoken"}, ["ANTHROPIC_API_KEY", *CLEARED], None, None
    cleared = ["ANTHROPIC_API_KEY", *(n for n in CLEARED if n != "OPENAI_API_KEY")]
    return _mini_env(url), cleared, None, None


@pytest.mark.parametrize("agent", sorted(EXECUTABLES))
def test_dry_run_prints_exact_settings_and_writes_nothing(agent: str, stub: Stub, user: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    fake = _fake_agent(user / "bin", EXECUTABLES[agent], user / "dump.json")
    before = _tree(user)
    got, err = _dry_run(agent, stub, capsys, "--", "-p", "fix it")
    assert _tree(user) == before, "a dry run must not write anything"
    assert err == ""
    settings, cleared, path, config = _expected(agent, stub.url, user / "home")
    assert got["export"] == settings
    assert got["unset"] == cleared
    assert got["argv"] == [str(fake), *_lead(agent, settings, stub.url), "-p", "fix it"]
    assert got["config"] == config
    assert got["config_path"] == (None if path is None else str(path))
    assert got["mkdir"] == (None if path is None else str(path.parent))
    assert got["comments"] == [f"# freetoken launch {agent}: dry run, nothing is written or started",
                               f"# server {stub.url}, model moe-test, context 65536 tokens, output 2048 tokens"]
    assert stub.seen == [("/health", None), ("/v1/models", None)]  # no key given: none sent


def test_dry_run_names_the_install_command_of_a_missing_agent(stub: Stub, user: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    got, _ = _dry_run("openclaw", stub, capsys)
    assert got["argv"] == ["openclaw"]
    assert got["comments"][-1] == ("# openclaw is not on PATH; install it with: "
                                   "npm install -g openclaw@latest (needs Node >= 24.16)")


def test_arguments_after_the_double_dash_reach_the_agent_verbatim(stub: Stub, user: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    got, _ = _dry_run("claude", stub, capsys, "--", "-p", "a 'quoted' arg", "--dry-run", "--model", "x", "--")
    assert got["argv"] == ["claude", *_lead("claude", got["export"]), "-p", "a 'quoted' arg", "--dry-run",
                           "--model", "x", "--"]
    assert got["export"]["ANTHROPIC_MODEL"] == "moe-test"


def test_server_and_key_from_the_environment_and_proxy_bypass(stub: Stub, user: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # a dead proxy: discovery only works because loopback bypasses it, and the agent is told to
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "example.com, .corp")
    monkeypatch.setenv("FREETOKEN_URL", f"{stub.url}/v1/")
    monkeypatch.setenv("FREETOKEN_API_KEY", "local-key")
    assert main(["launch", "claude", "--dry-run"]) == 0
    got = _parse_dry_run(capsys.readouterr().out)
    expected = _claude_env(stub.url, token="local-key")
    expected.update(NO_PROXY="example.com,.corp,127.0.0.1", no_proxy="example.com,.corp,127.0.0.1")
    assert got["export"] == expected
    assert stub.seen == [("/health", None), ("/v1/models", "Bearer local-key")]  # /health: no key
    assert main(["launch", "claude", "--dry-run", "--api-key", "flag-key"]) == 0
    assert stub.seen[-1] == ("/v1/models", "Bearer flag-key")


def test_model_is_picked_among_several_and_missing_limits_get_defaults(stub: Stub, user: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    stub.set_json({"data": [CARD, {"id": "other", "max_model_len": 8192}]})
    got, err = _dry_run("opencode", stub, capsys, "--model", "other")
    assert got["config"]["model"] == "freetoken/other"
    assert got["config"]["provider"]["freetoken"]["models"] == {
        "other": {"name": "other (FreeToken)", "tool_call": True, "limit": {"context": 8192, "output": 4096}}}
    assert err == ("freetoken launch: note: the model card of 'other' states no output cap (max_tokens); "
                   "assuming 4096 tokens\n")
    stub.set_json({"data": [{"id": "bare"}]})
    got, err = _dry_run("claude", stub, capsys)
    assert (got["export"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"], got["export"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == (
        "32768", "4096")
    assert err.splitlines() == [
        "freetoken launch: note: the model card of 'bare' states no context length; assuming 32768 tokens",
        "freetoken launch: note: the model card of 'bare' states no output cap (max_tokens); assuming 4096 tokens"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_server_is_one_line_and_exit_2(user: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    before = _tree(user)
    assert main(["launch", "opencode", "--server", url]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"freetoken launch: error: cannot reach the server at {url} (")
    assert err.endswith("); is `freetoken serve` running there?\n")
    assert _tree(user) == before


@pytest.mark.parametrize(("answer", "extra", "message"), [
    ((200, "text/plain", b"hello\nworld"), [], "{url}/v1/models did not answer JSON (got 'hello world')"),
    ((200, "application/json", b"[1, 2]"), [],
     '{url}/v1/models did not answer a model list (a JSON object with a "data" array)'),
    ((200, "application/json", b'{"data": []}'), [], "{url}/v1/models lists no model"),
    ((200, "application/json", b'{"data": [{"object": "model"}]}'), [],
     '{url}/v1/models listed a model without a string "id"'),
    ((200, "application/json", b'{"data": [{"id": "a"}, {"id": "b"}]}'), [],
     "{url}/v1/models lists several models (a, b); pick one with --model"),
    ((200, "application/json", b'{"data": [{"id": "a"}, {"id": "b"}]}'), ["--model", "c"],
     "model 'c' is not served by {url} (it serves: a, b)"),
    ((200, "application/json", b'{"data": [{"id": "m", "max_model_len": "big"}]}'), [],
     "{url}/v1/models: model 'm' has an invalid max_model_len ('big'); expected a positive integer"),
    ((200, "application/json", b'{"data": [{"id": "m", "max_tokens": 0}]}'), [],
     "{url}/v1/models: model 'm' has an invalid max_tokens (0); expected a positive integer"),
    ((401, "application/json", b'{"error": {"message": "invalid API key", "type": "auth"}}'), [],
     "{url}/v1/models answered HTTP 401: invalid API key (pass --api-key or set FREETOKEN_API_KEY)"),
    ((500, "text/plain", b"boom"), [], "{url}/v1/models answered HTTP 500: boom"),
])
def test_garbage_answers_are_one_line_errors(answer: tuple, extra: list[str], message: str, stub: Stub, user: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    stub.set_raw(*answer)
    assert main(["launch", "claude", "--server", stub.url, "--dry-run", *extra]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"freetoken launch: error: {message.format(url=stub.url)}\n")


def test_unknown_agent_and_stray_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["launch", "vim"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "freetoken launch: error: argument agent: invalid choice: 'vim'" in err
    assert all(name in err for name in ("claude", "opencode", "openclaw", "mini-swe-agent"))
    with pytest.raises(SystemExit) as exc:
        main(["launch", "claude", "stray"])
    assert exc.value.code == 2 and "unrecognized arguments: stray" in capsys.readouterr().err


def test_missing_agent_binary_fails_before_writing(stub: Stub, user: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _tree(user)
    assert main(["launch", "opencode", "--server", stub.url]) == 2
    assert capsys.readouterr().err == ("freetoken launch: error: 'opencode' is not on PATH; install it with: "
                                       "npm install -g opencode-ai\n")
    assert _tree(user) == before


def test_unwritable_config_folder_is_one_line_error(stub: Stub, user: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _fake_agent(user / "bin", "openclaw", user / "dump.json")
    blocker = user / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocker))
    assert main(["launch", "openclaw", "--server", stub.url]) == 2
    assert capsys.readouterr().err == (f"freetoken launch: error: cannot write {blocker}/freetoken/launch/openclaw/"
                                       "openclaw.json: Not a directory\n")
    assert not (user / "dump.json").exists()


# A launcher with only the ``launch`` sub-command: the same code path as ``freetoken launch`` without
# the ~3 s torch import that building the full parser costs (``serve`` reads engine defaults).
LIGHT_MAIN = ("import argparse, sys\n"
              "from freetoken.agents.launch import add_launch_parser, run_launch, split_agent_args\n"
              "parser = argparse.ArgumentParser(prog='freetoken')\n"
              "add_launch_parser(parser.add_subparsers(dest='command', required=True))\n"
              "own, agent_args = split_agent_args(sys.argv[1:])\n"
              "sys.exit(run_launch(parser.parse_args(own), agent_args))\n")


def _launch(entry: list[str], agent: str, url: str, *agent_args: str) -> tuple[int, int, str]:
    """Run the launcher in a child process: (its pid, exit status, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.Popen([sys.executable, *entry, "launch", agent, "--server", url, "--", *agent_args],
                            env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=60)
    return proc.pid, proc.returncode, err


def _check_exec(launched: tuple[int, int, str], agent: str, url: str, user: Path) -> None:
    pid, status, stderr = launched
    assert status == 7, stderr  # the agent's own exit status
    dump = json.loads((user / "dump.json").read_text())
    assert dump["pid"] == pid, "the agent must replace the launcher process (exec), not run as its child"
    settings, cleared, path, config = _expected(agent, url, user / "home")
    assert dump["argv"] == [str(user / "bin" / EXECUTABLES[agent]), *_lead(agent, settings, url), "run", "two words",
                            "--flag"]
    env = dump["env"]
    assert {k: env.get(k) for k in settings} == settings
    assert not set(cleared) & set(env), f"cloud credentials reached the agent: {set(cleared) & set(env)}"
    assert not [s for s in SECRET_VALUES for v in env.values() if s in v], "a cloud secret reached the agent"
    assert env["MY_SETTING"] == "kept" and env["HOME"] == str(user / "home")
    if path is None:
        assert dump["config"] is None
    else:
        assert json.loads(dump["config"]) == config
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (user / "home" / ".config" / "opencode" / "opencode.json").read_text() == '{"model": "anthropic/claude-x"}\n'
    where = f", config {path}" if path else ""
    assert stderr == f"freetoken launch: {agent} -> {url} model moe-test{where}\n"


@pytest.mark.parametrize("agent", sorted(EXECUTABLES))
def test_launch_execs_the_agent_with_its_env_and_config(agent: str, stub: Stub, user: Path) -> None:
    _fake_agent(user / "bin", EXECUTABLES[agent], user / "dump.json")
    _check_exec(_launch(["-c", LIGHT_MAIN], agent, stub.url, "run", "two words", "--flag"), agent, stub.url, user)


def test_freetoken_launch_command_line_execs_the_agent(stub: Stub, user: Path) -> None:
    _fake_agent(user / "bin", "opencode", user / "dump.json")
    _check_exec(_launch(["-m", "freetoken"], "opencode", stub.url, "run", "two words", "--flag"), "opencode",
                stub.url, user)
