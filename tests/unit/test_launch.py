"""``freetoken serve`` start-up failures: bad flags, a busy port and an unloadable model each end
with exit status 2 and one clear line, before any slow work and without a traceback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

from freetoken.cli import build_parser, main
from freetoken.launch import base_url, checkpoint_compute_dtype, serve


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "70000"], "argument --port: must be in [0, 65535], got 70000"),
        (["--port", "-1"], "argument --port: must be in [0, 65535], got -1"),
        (["--max-output-tokens", "0"], "argument --max-output-tokens: must be >= 1, got 0"),
        (["--max-model-len", "1"], "argument --max-model-len: must be >= 2, got 1"),
        (["--max-model-len", "lots"], "argument --max-model-len: invalid int value: 'lots'"),
        (["--moe-cache-slots", "0"], "argument --moe-cache-slots: invalid --moe-cache-slots '0': "
                                     "need at least 1 slot"),
        (["--moe-cache-slots", "1.5"], "argument --moe-cache-slots: invalid --moe-cache-slots "
                                       "'1.5': a fraction must be in (0, 1]"),
        (["--moe-cache-slots", "abc"], "argument --moe-cache-slots: invalid --moe-cache-slots "
                                       "'abc': give slots (96), a fraction of all experts (0.25) "
                                       "or a size (2GiB)"),
        (["--moe-backend", "gpu"], "argument --moe-backend: invalid choice: 'gpu' (choose from "
                                   "'resident', 'offload', 'cpu', 'hybrid', 'auto')"),
    ],
)
def test_out_of_range_flags_are_usage_errors(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", *flags])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"freetoken serve: error: {message}")


@pytest.fixture
def fake_checkpoint(tmp_path: Path) -> Path:
    """A directory that passes the ``config.json`` check but cannot be loaded."""
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_busy_port_fails_before_loading(fake_checkpoint, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code = main(["serve", "--model", str(fake_checkpoint), "--port", str(port)])
    assert code == 2
    # No "loading" (the model is never touched) and no false "listening on" line.
    assert capsys.readouterr().out == (
        f"[freetoken] error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    )


def test_empty_api_key_is_refused_before_loading(fake_checkpoint, capsys):
    args = build_parser().parse_args(
        ["serve", "--model", str(fake_checkpoint), "--port", "0", "--api-key", ""]
    )
    assert serve(args) == 2
    assert capsys.readouterr().out == (
        "[freetoken] error: api_key must be None (no auth) or a non-empty string\n"
    )


def test_unloadable_model_is_one_error_line(tiny_checkpoint, capsys):
    path = tiny_checkpoint("qwen3_next")
    limit = json.loads((path / "config.json").read_text())["max_position_embeddings"]
    args = build_parser().parse_args(
        ["serve", "--model", str(path), "--port", "0", "--max-model-len", "999999999"]
    )
    assert serve(args) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"[freetoken] loading {path} (bfloat16, cpu)"  # --dtype auto: stored bf16
    assert out[-1] == (
        f"[freetoken] error: cannot load {path}: max_model_len must be in [2, {limit}] for "
        f"{path}, got 999999999"
    )
    assert not any("listening" in line for line in out)


@pytest.mark.parametrize(("flags", "message"), [
    (["--device", "xyz"], "--device must be cpu or cuda[:i], got 'xyz'"),
    (["--device", ""], "--device must be cpu or cuda[:i], got ''"),
    (["--device", "meta"], "--device must be cpu or cuda[:i], got 'meta'"),
    (["--moe-backend", "cpu", "--moe-memory-floor", "lots"],
     "invalid --moe-memory-floor 'lots': expected a number with an optional unit (B, KB, MB, GB, "
     "TB, KiB, MiB, GiB, TiB), e.g. 2GiB"),
    (["--moe-backend", "cpu", "--moe-memory-floor", "0GiB"],
     "invalid --moe-memory-floor '0GiB': must be at least 1 byte"),
    (["--moe-backend", "cpu", "--moe-memory-floor", "1.5"],
     "invalid --moe-memory-floor '1.5': give a unit, e.g. 1.5MiB or 1.5B (a bare number is "
     "ambiguous)"),
    (["--moe-backend", "resident", "--moe-memory-floor", "1GiB"],
     "--moe-memory-floor needs an expert cache: use --moe-backend offload, cpu or hybrid"),
])
def test_bad_device_is_refused_before_loading(fake_checkpoint, capsys, flags, message):
    args = build_parser().parse_args(["serve", "--model", str(fake_checkpoint), "--port", "0",
                                      *flags])
    assert serve(args) == 2
    assert capsys.readouterr().out == f"[freetoken] error: {message}\n"


def test_unwritable_routing_record_is_refused_before_loading(fake_checkpoint, tmp_path, capsys):
    for bad in (tmp_path, tmp_path / "missing" / "x.npz"):
        args = build_parser().parse_args(["serve", "--model", str(fake_checkpoint), "--port", "0",
                                          "--record-routing", str(bad)])
        assert serve(args) == 2
        assert capsys.readouterr().out == (
            f"[freetoken] error: --record-routing {bad}: need a file path in an existing folder\n")


def test_base_url_brackets_ipv6():
    assert base_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert base_url("::1", 0) == "http://[::1]:0"


def test_q8_with_offload_notes_that_it_has_no_effect(capsys):
    from freetoken.launch import check_moe_flags

    args = build_parser().parse_args(["serve", "--moe-backend", "offload", "--moe-expert-format",
                                      "q4g", "--moe-cpu-activations", "q8"])
    moe = check_moe_flags(args)
    assert (moe.backend, moe.expert_format, moe.cpu_activations) == ("offload", "q4g", "q8")
    assert capsys.readouterr().out == (
        "[freetoken] note: --moe-cpu-activations q8 has no effect: --moe-backend offload fills "
        "every miss into the cache, so the CPU expert kernel never runs\n")


def test_q8_applies_to_an_mxfp4_release_without_an_expert_format(tiny_checkpoint, capsys):
    """``--moe-expert-format dense`` (the default) keeps a release's MXFP4 experts, so q8 takes
    them; a dense checkpoint still refuses q8 without a 4-bit format."""
    from freetoken.launch import check_moe_flags

    for backend in ("auto", "cpu"):
        args = build_parser().parse_args(["serve", "--model", str(tiny_checkpoint("gpt_oss")),
                                          "--moe-backend", backend, "--moe-cpu-activations", "q8"])
        moe = check_moe_flags(args)
        assert (moe.expert_format, moe.cpu_activations) == ("mxfp4", "q8")
    args = build_parser().parse_args(["serve", "--model", str(tiny_checkpoint("qwen3_moe")),
                                      "--moe-cpu-activations", "q8"])
    with pytest.raises(ValueError, match=r"needs 4-bit host expert banks: use --moe-expert-format "
                                         r"mxfp4 or q4g \(got dense\)$"):
        check_moe_flags(args)


@pytest.mark.parametrize("stored,key,expected", [
    ("bfloat16", "torch_dtype", "bfloat16"), ("float16", "torch_dtype", "bfloat16"),
    ("float32", "torch_dtype", "float32"), ("bfloat16", "dtype", "bfloat16"),
    (None, "torch_dtype", "float32"), ("bfloat16", "text_config", "bfloat16"),
    ("float32", "text_config", "float32"),
])
def test_dtype_auto_is_the_checkpoint_dtype(tmp_path, stored, key, expected):
    config = {} if stored is None else {key: stored}
    if key == "text_config":  # a multimodal release (Qwen3.5) keeps it in its text config
        config = {"text_config": {"dtype": stored}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert checkpoint_compute_dtype(tmp_path) == expected
    assert build_parser().parse_args(["serve"]).dtype == "auto"


def test_dtype_auto_with_a_broken_config_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        checkpoint_compute_dtype(tmp_path)


def test_make_tiny_into_an_unwritable_path_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["make-tiny", "--arch", "glm4_moe", str(blocker)]) == 2
    assert capsys.readouterr().err == f"error: cannot write {blocker}: File exists\n"


@pytest.mark.parametrize("stored,expected", [(torch.bfloat16, "bfloat16"),
                                             (torch.float32, "float32")])
def test_dtype_auto_without_a_config_dtype_reads_the_embedding(tmp_path, stored, expected):
    """gpt-oss's released config.json names no dtype: its stored embedding decides."""
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    save_file({"model.embed_tokens.weight": torch.zeros(4, 2, dtype=stored)},
              str(tmp_path / "model.safetensors"))
    assert checkpoint_compute_dtype(tmp_path) == expected
