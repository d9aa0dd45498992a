"""``freetoken convert``: the files it writes (banks aligned, checksums per layer chunk, no expert
tensor left in the safetensors, the tokenizer and config beside them), its refusals, the reader's
direct and buffered paths, load progress, and the memory plan's count of packed banks."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest
import torch
from safetensors import safe_open

from freetoken.cli import main
from freetoken.engine.memory_plan import checkpoint_weight_bytes
from freetoken.models.loader import Checkpoint
from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig
from freetoken.packed import reader as packed_reader
from freetoken.packed.convert import convert
from freetoken.packed.manifest import ALIGN, read_manifest
from tests.packed.test_packed_parity import greedy


def test_convert_cli_writes_a_packed_checkpoint(packed_pair, tmp_path, capsys) -> None:
    src, _ = packed_pair("gpt_oss-mxfp4")
    dst = tmp_path / "packed"
    assert main(["convert", str(src), str(dst)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (f"[freetoken] wrote packed checkpoint {dst}: 4 MoE layers x 16 experts in "
                       f"mxfp4, 0.00 GB of banks")
    names = {p.name for p in dst.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
            "experts.ftw", "freetoken-packed.json"} <= names
    manifest = read_manifest(dst)
    assert manifest.expert_format == "mxfp4" and manifest.biased and manifest.dtype is None
    assert [b.name for b in manifest.banks] == ["gate_up.0", "gate_up.1", "down.0", "down.1",
                                                "gate_up_bias", "down_bias"]
    assert all(b.offset % ALIGN == 0 for b in manifest.banks)
    assert (dst / "experts.ftw").stat().st_size % ALIGN == 0
    assert manifest.banks[0].shape == (64, 256, 8, 16)  # [L * E, 2I, H / 32, 16] codes
    with safe_open(dst / "model.safetensors", framework="pt") as f:
        assert not [n for n in f.keys() if ".mlp.experts." in n]
        assert "model.embed_tokens.weight" in f.keys()


def test_convert_refuses_a_used_destination_and_a_packed_source(packed_pair, capsys) -> None:
    src, dst = packed_pair("qwen3_moe-bf16")
    assert main(["convert", str(src), str(dst)]) == 2
    assert capsys.readouterr().out == (f"[freetoken] error: {dst} exists and is not an empty "
                                       f"directory\n")
    assert main(["convert", str(dst), str(dst.parent / "again")]) == 2
    assert capsys.readouterr().out == f"[freetoken] error: {dst} is a packed checkpoint already\n"


def test_small_chunks_are_cut_per_layer_and_load_the_same(packed_pair, tmp_path) -> None:
    """64 KiB chunks: 32 per layer of gate_up (2 MiB), none straddling two layers."""
    src, _ = packed_pair("qwen3_moe-bf16")
    manifest = convert(src, tmp_path / "small", chunk_bytes=64 * 2**10)
    gate_up = manifest.banks[0]
    assert len(gate_up.crc32) == 4 * 32
    assert gate_up.chunks(4, manifest.chunk_bytes, range(1, 2))[0][:2] == (2 * 2**20, 64 * 2**10)
    moe = MoeConfig(backend="cpu")
    assert torch.equal(greedy(load_model(tmp_path / "small", moe=moe), src),
                       greedy(load_model(src, moe=moe), src))


def _bytes_read(monkeypatch) -> list[packed_reader.ChunkReader]:
    """Record every ChunkReader made (to read its direct / buffered counts afterwards)."""
    made = []
    real = packed_reader.ChunkReader.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(packed_reader.ChunkReader, "__init__", init)
    return made


def test_banks_are_read_with_direct_io_where_the_filesystem_allows(packed_pair,
                                                                   monkeypatch) -> None:
    _, dst = packed_pair("qwen3_moe-bf16")
    try:
        os.close(os.open(dst / "experts.ftw", os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    readers = _bytes_read(monkeypatch)
    load_model(dst, moe=MoeConfig(backend="offload", cache="2"))
    (reader,) = readers
    assert reader.direct_bytes == read_manifest(dst).nbytes and reader.buffered_bytes == 0


@pytest.mark.parametrize("where", ["open", "read"])
def test_einval_from_o_direct_falls_back_to_buffered_reads(packed_pair, monkeypatch,
                                                           where) -> None:
    src, dst = packed_pair("qwen3_moe-bf16")
    real_open, real_preadv = os.open, os.preadv

    def refusing_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    def refusing_preadv(fd, buffers, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset)

    if where == "open":
        monkeypatch.setattr(packed_reader.os, "open", refusing_open)
    else:
        monkeypatch.setattr(packed_reader.os, "preadv", refusing_preadv)
    readers = _bytes_read(monkeypatch)
    moe = MoeConfig(backend="offload", cache="2")
    model = load_model(dst, moe=moe)
    monkeypatch.undo()
    assert readers[0].direct_bytes == 0
    assert readers[0].buffered_bytes == read_manifest(dst).nbytes
    assert torch.equal(greedy(model, dst), greedy(load_model(src, moe=moe), src))


def test_load_progress_counts_the_banks(packed_pair) -> None:
    """The other weights, then the banks as one more shard, up to their sum (what /health
    reports while loading)."""
    _, dst = packed_pair("qwen3_moe-bf16")
    steps = []
    load_model(dst, moe=MoeConfig(backend="offload", cache="2"), progress=steps.append)
    checkpoint = Checkpoint(dst)
    plain = sum(checkpoint.nbytes(n) for n in checkpoint.files)
    total = plain + read_manifest(dst).nbytes
    reads = [s for s in steps if s.stage == "read"]
    assert steps[:len(reads)] == reads  # the banks' huge pages come after the read
    assert {s.total_bytes for s in reads} == {total}
    done = [s.done_bytes for s in reads]
    assert done == sorted(done) and done[-1] == total
    assert reads[-1].shard == reads[-1].num_shards == 2 and reads[-1].shard_done


def test_the_memory_plan_counts_packed_banks_as_experts(packed_pair) -> None:
    src, dst = packed_pair("qwen3_moe-bf16")
    for width in (2, 4):
        assert checkpoint_weight_bytes(dst, width) == checkpoint_weight_bytes(src, width)


def test_convert_names_what_is_wrong_with_its_paths(packed_pair, tmp_path, capsys) -> None:
    src, _ = packed_pair("qwen3_moe-bf16")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args, message in [
        ((tmp_path / "nowhere", tmp_path / "o1"), f"{tmp_path / 'nowhere'} does not exist"),
        ((src / "config.json", tmp_path / "o2"),
         f"{src / 'config.json'} is not a directory: give the checkpoint's directory"),
        ((src, afile), f"{afile} is a file: give a new or empty directory"),
        ((src, src / "packed"), f"{src / 'packed'} is inside {src}: write the packed checkpoint "
                                "elsewhere"),
    ]:
        assert main(["convert", *map(str, args)]) == 2
        assert capsys.readouterr().out == f"[freetoken] error: {message}\n"
    assert not (src / "packed").exists()


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     KeyboardInterrupt()])
@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_or_interrupted_convert_leaves_nothing_behind(
        packed_pair, tmp_path, monkeypatch, capsys, failure, existing) -> None:
    """Writing stops after the banks (the disk fills, or Ctrl-C): the destination is removed (or
    emptied, when it was an empty directory already), so the same command runs again."""
    from freetoken.packed import convert as convert_module

    src, _ = packed_pair("qwen3_moe-bf16")
    dst = tmp_path / "out"
    if existing:
        dst.mkdir()

    def fail(*_args) -> None:
        assert (dst / "experts.ftw").stat().st_size > 0  # the banks were written first
        raise failure

    monkeypatch.setattr(convert_module, "_write_other", fail)
    code = main(["convert", str(src), str(dst)])
    out = capsys.readouterr().out
    if isinstance(failure, KeyboardInterrupt):
        assert (code, out.splitlines()[-1]) == (
            130, f"[freetoken] interrupted: nothing was left in {dst}")
    else:
        assert (code, out.splitlines()[-1]) == (
            2, f"[freetoken] error: cannot write {dst}: No space left on device")
    assert (dst.exists(), list(dst.iterdir()) if existing else []) == (existing, [])
    monkeypatch.undo()
    assert main(["convert", str(src), str(dst)]) == 0  # the same command, again
