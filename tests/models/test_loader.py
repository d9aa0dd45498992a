"""Checkpoint loading: sharded index, dtype cast, and clear errors for bad checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken.models.registry import load_model
from tests.models.conftest import prompt_ids

EXPERT = "model.layers.0.mlp.experts.3.up_proj.weight"


def copy_with_tensors(src: Path, dst: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """``src``'s side files plus ``tensors`` as a single model.safetensors in ``dst``."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def source(tiny_checkpoint) -> tuple[Path, dict[str, torch.Tensor]]:
    path = tiny_checkpoint("qwen3_next")
    return path, load_file(path / "model.safetensors")


def test_sharded_index_gives_identical_logits(source, tmp_path) -> None:
    path, tensors = source
    sharded = tmp_path / "sharded"
    shutil.copytree(path, sharded, ignore=shutil.ignore_patterns("*.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for i in range(3):
        shard = f"model-{i + 1:05d}-of-00003.safetensors"
        part = {n: tensors[n] for n in names[i::3]}
        save_file(part, str(sharded / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    ids = prompt_ids(path, 40)
    a, b = load_model(path), load_model(sharded)
    assert torch.equal(a(ids, a.new_state(), all_logits=True), b(ids, b.new_state(), all_logits=True))


def test_mtp_tensors_are_ignored(source, tmp_path) -> None:
    path, tensors = source
    extra = dict(tensors, **{"mtp.fc.weight": torch.zeros(4, 4, dtype=torch.bfloat16)})
    model = load_model(copy_with_tensors(path, tmp_path / "mtp", extra))
    assert model.config.model_type == "qwen3_next"


def test_missing_tensor(source, tmp_path) -> None:
    path, tensors = source
    bad = copy_with_tensors(path, tmp_path / "missing", {n: t for n, t in tensors.items() if n != EXPERT})
    with pytest.raises(ValueError) as err:
        load_model(bad)
    assert str(err.value) == f"checkpoint {bad} is missing 1 tensor(s): {EXPERT}"


def test_unexpected_tensor(source, tmp_path) -> None:
    path, tensors = source
    extra = dict(tensors, **{"model.layers.0.mlp.experts.99.up_proj.weight": tensors[EXPERT].clone()})
    bad = copy_with_tensors(path, tmp_path / "unexpected", extra)
    with pytest.raises(ValueError) as err:
        load_model(bad)
    assert str(err.value) == (
        f"checkpoint {bad} has 1 unexpected tensor(s) (other than mtp.*, model.visual.*): "
        "model.layers.0.mlp.experts.99.up_proj.weight"
    )


def test_misshaped_tensor(source, tmp_path) -> None:
    path, tensors = source
    bad = copy_with_tensors(path, tmp_path / "shape", dict(tensors, **{EXPERT: tensors[EXPERT][:-1]}))
    with pytest.raises(ValueError) as err:
        load_model(bad)
    assert str(err.value) == (
        f"checkpoint {bad}: tensor '{EXPERT}' has shape [127, 256], expected [128, 256]"
    )


def test_missing_files_and_bad_index(source, tmp_path) -> None:
    path, _ = source
    empty = tmp_path / "empty"
    shutil.copytree(path, empty, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(FileNotFoundError) as err:
        load_model(empty)
    assert str(err.value) == f"no model.safetensors or model.safetensors.index.json in {empty}"
    (empty / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(FileNotFoundError) as err:
        load_model(empty)
    assert str(err.value) == (
        "model.safetensors.index.json: shard 'model-00001-of-00002.safetensors' "
        "(for 'lm_head.weight') not found"
    )
    with pytest.raises(FileNotFoundError) as err:
        load_model(tmp_path / "nowhere")
    assert str(err.value) == f"no config.json in {tmp_path / 'nowhere'}"


def test_unknown_architecture(source, tmp_path) -> None:
    path, _ = source
    other = tmp_path / "other"
    shutil.copytree(path, other)
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        load_model(other)
    assert str(err.value) == (
        "unsupported architecture 'LlamaForCausalLM'; supported: Glm4MoeForCausalLM, "
        "GptOssForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, Qwen3_5MoeForCausalLM, "
        "Qwen3_5MoeForConditionalGeneration"
    )


def test_bfloat16_compute(source) -> None:
    path, tensors = source
    fp32, bf16 = load_model(path), load_model(path, dtype=torch.bfloat16)
    assert bf16.embed.dtype == torch.bfloat16 and bf16.layers[0].mixer.A_log.dtype == torch.float32
    # bf16 on disk: the loaded bf16 weights are the stored values exactly
    assert torch.equal(bf16.lm_head, tensors["lm_head.weight"])
    ids = prompt_ids(path, 48)
    a = fp32(ids, fp32.new_state(), all_logits=True)
    b = bf16(ids, bf16.new_state(), all_logits=True)
    assert b.dtype == torch.float32
    assert (a - b).abs().max().item() < 0.25
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.9
    with pytest.raises(ValueError) as err:
        load_model(path, dtype=torch.float16)
    assert str(err.value) == "unsupported dtype torch.float16; supported: float32, bfloat16"


def test_weights_beyond_available_host_memory_are_refused_before_loading(
        tiny_checkpoint, monkeypatch) -> None:
    from freetoken.models import registry
    from freetoken.offload.backend import MoeConfig

    path = tiny_checkpoint("qwen3_moe")
    read = []
    monkeypatch.setattr(registry, "load_weights", lambda *a: read.append(a))
    monkeypatch.setattr(registry, "available_host_memory", lambda: 10 * 2**20)
    with pytest.raises(ValueError) as err:
        load_model(path)
    # 4 MoE layers x 16 experts x 3 x H 256 x I 128 in fp32 = 24 MiB; embedding + lm_head
    # 2 x 8256 x 256 fp32 = 16.125 MiB, attention, norms and routers make the other 19.20 MiB
    assert str(err.value) == (
        f"{path}: loading needs 43.20 MiB of host memory (routed experts 24.00 MiB in float32, "
        "other weights 19.20 MiB) but only 10.00 MiB is available (MemAvailable): free memory, "
        "serve on a device with room for the non-expert weights, or pick a smaller checkpoint")
    with pytest.raises(ValueError) as err:  # offloaded: bf16 banks of the bf16-stored experts
        load_model(path, moe=MoeConfig(backend="cpu"))
    assert "needs 31.20 MiB of host memory (routed experts 12.00 MiB in bfloat16, " in str(err.value)
    assert read == []
    monkeypatch.setattr(registry, "available_host_memory", lambda: 44 * 2**20)
    load_model(path)
    assert len(read) == 1


def test_a_truncated_safetensors_file_is_a_clear_error(tiny_checkpoint, tmp_path) -> None:
    import shutil

    bad = tmp_path / "truncated"
    shutil.copytree(tiny_checkpoint("qwen3_moe"), bad)
    with open(bad / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ValueError) as err:
        load_model(bad)
    assert str(err.value).startswith(
        f"{bad / 'model.safetensors'}: not a readable safetensors file (truncated or corrupt: ")
