"""``evals/peers/compare_llamacpp.sh`` argument handling (only invocations that stop before
anything is built, converted or started: every run here gets a project python that does not
exist, so even a check that wrongly passed would stop at the python check with nothing done) and
the GGUF cache pruning of ``evals/peers/gguf_cache.py``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from evals.peers.gguf_cache import main as gguf_cache_main
from evals.peers.gguf_cache import prune, stale_files

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "evals" / "peers" / "compare_llamacpp.sh"
KEY_OLD, KEY_NEW = "0123456789ab", "fedcba987654"


def _script(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("FT_PORT", "LL_PORT", "FREETOKEN_SHARED")}
    base.update(FREETOKEN_PYTHON=str(tmp_path / "no-python"), FREETOKEN_CACHE=str(tmp_path / "cache"),
                HOME=str(tmp_path / "home"), **env)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=tmp_path, env=base, capture_output=True,
                          text=True, timeout=60)


def test_script_parses() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_help_prints_the_whole_usage(tmp_path: Path) -> None:
    res = _script(tmp_path, "--help")
    assert res.returncode == 0 and res.stderr == ""
    text = res.stdout
    assert text.startswith("FreeToken vs llama.cpp on identical weights: one command, one report.\n")
    for line in ("  --limit-turns N       model calls replayed per workload, positive integer [8]",
                 "  --allow-synthetic     replay the built-in synthetic traces when the traces folder is missing",
                 "  --llama-kv f32|f16    llama.cpp KV cache dtype [f32, like FreeToken's]",
                 "  --fresh-gguf          convert again even when the cached GGUF is up to date",
                 "Environment: FT_PORT [8411] and LL_PORT [8412] (the two servers' ports), FREETOKEN_CACHE",
                 " 6. DIR/report.md: settings (traces source included), parity, one table per workload (ratios"):
        assert line in text.splitlines()
    assert "set -euo" not in text


@pytest.mark.parametrize(("args", "message"), [
    (["--limit-turns"], "error: option --limit-turns needs a value"),
    (["--out"], "error: option --out needs a value"),
    (["--limit-turns", "0"], "error: --limit-turns must be a positive integer (got '0')"),
    (["--limit-turns", "-3"], "error: --limit-turns must be a positive integer (got '-3')"),
    (["--limit-turns", "two"], "error: --limit-turns must be a positive integer (got 'two')"),
    (["--threads", "1.5"], "error: --threads must be a positive integer (got '1.5')"),
    (["--workloads", "W1 W9"], "error: unknown workload W9 (expected W1 W2 W3 W4)"),
    (["--frobnicate"], "error: unknown option --frobnicate"),
    (["--traces", "synthetic"], "error: --traces synthetic needs --allow-synthetic"),
    (["--arch", "qwen3"], "error: --arch must be qwen3_moe, qwen3_next, qwen3_5_moe, glm4_moe or "
                          "gpt_oss (got 'qwen3')"),
    (["--outtype", "mxfp4"], "error: --outtype mxfp4 applies to --arch gpt_oss only"),
    (["--arch"], "error: option --arch needs a value"),
])
def test_bad_options_are_usage_errors_before_anything_starts(tmp_path: Path, args: list[str],
                                                             message: str) -> None:
    res = _script(tmp_path, *args, "--out", str(tmp_path / "out")) if args != ["--out"] else \
        _script(tmp_path, *args)
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == message
    assert "unbound variable" not in res.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_missing_traces_are_refused_unless_synthetic_is_allowed(tmp_path: Path) -> None:
    res = _script(tmp_path, "--traces", str(tmp_path / "nope"))
    assert (res.returncode, res.stderr.splitlines()[0]) == (2, f"error: --traces {tmp_path}/nope: no such folder")
    res = _script(tmp_path, FREETOKEN_SHARED=str(tmp_path / "shared"))
    assert res.returncode == 2
    assert res.stderr == (f"error: no traces folder at {tmp_path}/shared/traces: pass --traces DIR or set "
                          "FREETOKEN_SHARED (or --allow-synthetic to compare on the built-in synthetic set, "
                          "not real agent traffic)\n")
    # allowed: it gets past the traces check and stops at the (missing) project python
    res = _script(tmp_path, "--allow-synthetic", FREETOKEN_SHARED=str(tmp_path / "shared"))
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        f"warning: no traces folder at {tmp_path}/shared/traces; replaying the built-in SYNTHETIC set "
        "(--allow-synthetic)",
        f"error: project python {tmp_path}/no-python not found (make the .venv first)"]


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"GGUF")


def test_prune_deletes_only_older_conversions(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    old = [f"small-qwen3_moe-{KEY_OLD}-f32.gguf", f"small-qwen3_moe-{KEY_OLD}-bf16.gguf",
           f"small-qwen3_moe-{KEY_OLD}-f32.gguf.tmp"]
    kept = [f"small-qwen3_moe-{KEY_NEW}-bf16.gguf", "notes.txt", "my-model.gguf",
            f"small-qwen3_moe-{KEY_OLD.upper()}-f32.gguf", f"small-qwen3_moe-{KEY_OLD}-q4.gguf",
            f"big-qwen3_moe-{KEY_OLD}-f32.gguf"]
    current = f"small-qwen3_moe-{KEY_NEW}-f32.gguf"
    _touch(tmp_path, current, *old, *kept)
    assert stale_files(tmp_path / current) == sorted(tmp_path / n for n in old)
    assert gguf_cache_main(["prune", str(tmp_path / current)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([current, *kept])
    assert capsys.readouterr().err.splitlines() == [f"deleted stale {tmp_path / n} (0 MiB)" for n in sorted(old)]
    assert prune(tmp_path / current) == []


def test_prune_refuses_a_current_file_outside_the_pattern(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    _touch(tmp_path, "model.gguf", f"small-qwen3_moe-{KEY_OLD}-f32.gguf")
    assert gguf_cache_main(["prune", str(tmp_path / "model.gguf")]) == 2
    assert capsys.readouterr().err == ("gguf_cache: model.gguf: not a name of the form "
                                       "small-<qwen3_moe|qwen3_next>-<12 hex>-<f32|bf16|f16>.gguf\n")
    assert (tmp_path / f"small-qwen3_moe-{KEY_OLD}-f32.gguf").exists()


def test_prune_keeps_the_other_family(tmp_path: Path) -> None:
    other = [f"small-qwen3_moe-{KEY_OLD}-f32.gguf", f"small-qwen3_moe-{KEY_NEW}-bf16.gguf"]
    old = [f"small-qwen3_next-{KEY_OLD}-f32.gguf"]
    current = f"small-qwen3_next-{KEY_NEW}-f32.gguf"
    _touch(tmp_path, current, *old, *other)
    assert prune(tmp_path / current) == [tmp_path / n for n in old]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([current, *other])
