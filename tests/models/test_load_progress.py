"""Load progress: every stored byte of the loaded tensors counted once, shard by shard, reported
as log lines off a terminal; the sharded layout read through its index."""

from __future__ import annotations

import json
import shutil

import torch

from freetoken.models.config import ModelConfig
from freetoken.models.load_progress import LoadStep, load_reporter
from freetoken.models.loader import INDEX_FILE, Checkpoint
from freetoken.models.registry import load_model
from freetoken.models.tiny_weights import write_safetensors
from freetoken.tokenizer.tokenizer import Tokenizer


def _sharded(tiny_checkpoint, tmp_path, arch="qwen3_5_moe"):
    src = tiny_checkpoint(arch)
    dst = tmp_path / f"sharded-{arch}"
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    raw = json.loads((src / "config.json").read_text())
    files = write_safetensors(ModelConfig.from_hf(raw), 0, dst, max_shard_bytes=6 * 2**20,
                              vision_config=raw.get("vision_config"))
    return src, dst, files


def test_progress_counts_every_loaded_byte_per_shard(tiny_checkpoint, tmp_path) -> None:
    src, dst, files = _sharded(tiny_checkpoint, tmp_path)
    shards = len(files) - 1  # the index is last
    assert files[-1].name == INDEX_FILE and shards >= 3
    steps: list[LoadStep] = []
    model = load_model(dst, progress=steps.append)
    checkpoint = Checkpoint(dst)
    total = sum(checkpoint.nbytes(n) for n in checkpoint.files)
    assert total == sum(t.numel() * (4 if t.dtype == torch.float32 else 2)
                        for t in _stored_loaded(dst))
    assert [s.done_bytes for s in steps] == sorted(s.done_bytes for s in steps)
    assert steps[-1].done_bytes == steps[-1].total_bytes == total
    assert {s.num_shards for s in steps} == {shards}
    assert [s.shard for s in steps if s.shard_done] == list(range(1, shards + 1))
    ids = torch.arange(3, 40)
    same = load_model(src)  # the single-file checkpoint of the same seed, its end-of-turn
    end = Tokenizer.from_pretrained(src).token_to_id("<|im_end|>")  # lm_head row calibrated
    a, b = model(ids, model.new_state())[0], same(ids, same.new_state())[0]
    others = torch.arange(a.shape[0]) != end
    assert torch.equal(a[others], b[others]) and not torch.equal(a[end], b[end])


def _stored_loaded(path):
    """Every stored tensor the engine loads (the vision tower is not)."""
    from safetensors.torch import load_file

    for file in sorted(path.glob("model-*.safetensors")):
        for name, tensor in load_file(file).items():
            if not name.startswith("model.visual."):
                yield tensor


def test_off_a_terminal_one_line_per_shard() -> None:
    lines: list[str] = []
    times = iter([10.0, 10.5, 12.0])
    report = load_reporter(lines.append, terminal=False, clock=lambda: next(times))
    gib = 2**30
    report(LoadStep(gib // 2, 3 * gib, 1, 2, False))
    report(LoadStep(gib, 3 * gib, 1, 2, True))
    report(LoadStep(3 * gib, 3 * gib, 2, 2, True))
    assert lines == ["read shard 1/2: 1.00 GiB of 3.00 GiB in 0.5 s, 2.15 GB/s",
                     "read shard 2/2: 3.00 GiB of 3.00 GiB in 2.0 s, 1.61 GB/s"]
    report(LoadStep(gib, gib, 1, 1, True))  # a single file: no line of its own
    assert len(lines) == 2


def test_from_pretrained_reports_its_stages_and_bytes(tiny_checkpoint, tmp_path) -> None:
    """The hooks ``freetoken serve`` feeds ``/health`` from: each stage once, in order (the offload
    backend places its experts after the last tensor), and the bytes of every tensor read."""
    from freetoken.engine.async_engine import AsyncEngine
    from freetoken.offload.backend import MoeConfig

    src, dst, _ = _sharded(tiny_checkpoint, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    stages: list[str] = []
    steps: list[LoadStep] = []
    engine = AsyncEngine.from_pretrained(dst, moe=MoeConfig(backend="offload", cache="0.5"),
                                         on_stage=stages.append, on_step=steps.append)
    try:
        assert stages == ["tokenizer", "weights", "experts", "engine"]
        checkpoint = Checkpoint(dst)
        total = sum(checkpoint.nbytes(n) for n in checkpoint.files)
        assert steps[-1].done_bytes == steps[-1].total_bytes == total
        assert [s.done_bytes for s in steps] == sorted(s.done_bytes for s in steps)
        assert engine.is_healthy()
    finally:
        engine.shutdown()


def test_off_a_terminal_one_line_per_later_stage() -> None:
    lines: list[str] = []
    times = iter([0.0, 2.0, 4.0, 5.0, 10.0, 10.25])
    report = load_reporter(lines.append, terminal=False, clock=lambda: next(times))
    gib = 2**30
    report(LoadStep(gib, gib, 1, 1, True))  # one file: no line of its own
    report(LoadStep(0, 4 * gib, 1, 1, False, "quantise"))  # starts at 2.0
    report(LoadStep(2 * gib, 4 * gib, 1, 1, False, "quantise"))
    report(LoadStep(4 * gib, 4 * gib, 1, 1, True, "quantise"))  # done at 4.0
    report(LoadStep(0, 2 * gib, 1, 1, False, "pin"))  # starts at 5.0
    report(LoadStep(2 * gib, 2 * gib, 1, 1, True, "pin"))  # done at 10.0
    report.close()
    assert lines == ["quantise: 4.00 GiB in 2.0 s, 2.15 GB/s",
                     "pin: 2.00 GiB in 5.0 s, 0.43 GB/s"]


def test_on_a_terminal_one_bar_per_stage() -> None:
    import io

    from rich.console import Console

    out = io.StringIO()
    report = load_reporter(lambda _m: None, terminal=True,
                           console=Console(file=out, force_terminal=True, width=140))
    gib = 2**30
    for done, shard in ((gib, 1), (2 * gib, 1), (3 * gib, 2)):
        report(LoadStep(done, 3 * gib, shard, 2, done in (2 * gib, 3 * gib)))
    report(LoadStep(0, 2 * gib, 1, 1, False, "pin"))
    report(LoadStep(2 * gib, 2 * gib, 1, 1, True, "pin"))
    report.close()
    text = out.getvalue()
    for part in ("[freetoken] read", "[freetoken] pin", "shard 2/2", "ETA", "3.2/3.2 GB"):
        assert part in text, text


def test_quantising_the_banks_is_a_stage_of_its_own(tiny_checkpoint) -> None:
    """The offloaded banks quantised at load report the dense bytes they convert, after the read
    (only the read counts on /health: ``from_pretrained``'s ``on_step``)."""
    from freetoken.offload.backend import MoeConfig

    src = tiny_checkpoint("qwen3_moe")
    steps: list[LoadStep] = []
    model = load_model(src, moe=MoeConfig(backend="offload", cache="2", expert_format="mxfp4"),
                       progress=steps.append)
    config = ModelConfig.from_file(src)
    layers = sum(config.is_moe_layer(i) for i in range(config.num_hidden_layers))
    # bf16 banks (the checkpoint is stored in bf16): 2 bytes per weight
    dense = layers * config.num_experts * 3 * config.hidden_size * config.moe_intermediate_size * 2
    stages = [s.stage for s in steps]
    reads = stages.count("read")
    # a CPU device: the 4-bit banks then move onto 2 MiB pages in the background, no stage
    assert stages == ["read"] * reads + ["quantise", "quantise"]
    quantise = steps[reads:]
    assert [(s.done_bytes, s.total_bytes) for s in quantise] == [(0, dense), (dense, dense)]
    assert model.moe_runtime.banks.format == "mxfp4" and model.bank_collapse.wait(60)
