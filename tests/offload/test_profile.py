"""MoeProfile JSON, its cache path, and B_P / B_H measurement at the tiny model's expert shapes."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from freetoken.cli import main
from freetoken.models.config import ModelConfig
from freetoken.models.tiny_presets import preset_config
from freetoken.offload.profile import (
    MoeProfile,
    default_profile_path,
    load_profile,
    measure_profile,
    save_profile,
)
from freetoken.ops.cpu_moe import cpu

PROFILE = MoeProfile(device="cpu", bank_dtype="bfloat16", hidden=256, intermediate=128,
                     expert_bytes=196608, bandwidth_p_gbps=5.5, bandwidth_h_gbps=2.2,
                     cpu_threads=2, created="2026-01-01T00:00:00+00:00", model="/m",
                     kernel_dtype="bfloat16")


@pytest.fixture()
def config_dir(tmp_path):
    """A checkpoint folder holding only the tiny qwen3_next config.json (all profile needs)."""
    d = tmp_path / "tiny model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(preset_config("qwen3_next", "tiny", 8192, 1, 2)))
    return d


def test_json_round_trip_and_ratio(tmp_path):
    assert MoeProfile.from_json(PROFILE.to_json()) == PROFILE
    assert PROFILE.ratio == pytest.approx(2.5)
    path = save_profile(PROFILE, tmp_path / "a" / "p.json")
    assert load_profile(path) == PROFILE
    assert load_profile(tmp_path / "absent.json") is None


@pytest.mark.parametrize("text, reason", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({k: v for k, v in dataclasses.asdict(PROFILE).items() if k != "hidden"}),
     "'hidden'"),
    (json.dumps(dataclasses.asdict(PROFILE) | {"bandwidth_h_gbps": 0}), "positive"),
    (json.dumps(dataclasses.asdict(PROFILE) | {"cpu_threads": "2"}), "'cpu_threads'"),
])
def test_corrupt_profile_names_the_file(tmp_path, text, reason):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="corrupt MoE profile") as info:
        load_profile(path)
    assert str(path) in str(info.value) and reason in str(info.value)


def test_default_path_keys_on_config_device_and_dtype(config_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FREETOKEN_CACHE", str(tmp_path / "cache"))
    path = default_profile_path(config_dir, "cpu", "bfloat16")
    assert path.parent == tmp_path / "cache" / "profiles"
    assert path.name.startswith("tiny_model-") and path.name.endswith("-cpu-bfloat16.json")
    assert default_profile_path(config_dir, "cuda", "bfloat16") != path
    cuda = default_profile_path(config_dir, "cuda", "bfloat16")
    assert default_profile_path(config_dir, "cuda:1", "bfloat16") == cuda
    assert default_profile_path(config_dir, "cpu", "float32") != path
    (config_dir / "config.json").write_text((config_dir / "config.json").read_text() + " ")
    assert default_profile_path(config_dir, "cpu", "bfloat16") != path


@pytest.mark.parametrize("bank_dtype, itemsize", [("bfloat16", 2), ("float32", 4)])
def test_measure_tiny_shapes(config_dir, bank_dtype, itemsize):
    config = ModelConfig.from_file(config_dir)
    p = measure_profile(config, device="cpu", bank_dtype=bank_dtype, seconds=0.05,
                        model="tiny", bank_bytes=4 * 2**20)
    assert (p.hidden, p.intermediate) == (256, 128)
    assert p.expert_bytes == 3 * 256 * 128 * itemsize
    assert p.bank_dtype == bank_dtype and p.device == "cpu" and p.model == "tiny"
    # kernels with submit_banks read fp32 banks; older builds fall back to bf16
    assert p.kernel_dtype == (bank_dtype if hasattr(cpu, "submit_banks") else "bfloat16")
    for bw in (p.bandwidth_p_gbps, p.bandwidth_h_gbps):
        assert math.isfinite(bw) and 0.01 < bw < 1000
    assert p.cpu_threads >= 1


def test_measure_rejects_bad_arguments(config_dir):
    config = ModelConfig.from_file(config_dir)
    with pytest.raises(ValueError, match="device"):
        measure_profile(config, device="tpu")
    with pytest.raises(ValueError, match="bank_dtype"):
        measure_profile(config, bank_dtype="float16")
    with pytest.raises(ValueError, match="seconds"):
        measure_profile(config, seconds=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            measure_profile(config, device="cuda")


def test_cli_writes_out_file(config_dir, tmp_path, capsys):
    out = tmp_path / "prof.json"
    rc = main(["profile", "--model", str(config_dir), "--device", "cpu", "--dtype", "bfloat16",
               "--seconds", "0.05", "--out", str(out)])
    assert rc == 0
    p = load_profile(out)
    assert p.bank_dtype == "bfloat16" and p.model == str(config_dir.resolve())
    text = capsys.readouterr().out
    assert "B_P / B_H" in text and str(out) in text


def test_cli_missing_model_is_usage_error(tmp_path, capsys):
    assert main(["profile", "--model", str(tmp_path), "--seconds", "0.05"]) == 2
    assert "no config.json" in capsys.readouterr().err
