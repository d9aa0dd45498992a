"""Bad packed checkpoints: a truncated bank file, a manifest version this FreeToken does not
read, a checksum mismatch and a missing bank file each give an error naming the file and the
byte offset; ``serve`` refuses the first before serving and exits 2 after a failed read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from freetoken.models.registry import load_model
from freetoken.offload.backend import MoeConfig
from freetoken.packed.manifest import read_manifest
from freetoken.packed.reader import ChunkRead, ChunkReader
from tests.clients.server import REPO_ROOT, ServerProcess, free_port

VARIANT = "qwen3_moe-bf16"  # gate_up [64, 256, 256] bf16: one 2 MiB chunk per layer
LAYER_BYTES = 16 * 256 * 256 * 2


def _flip(file: Path, offset: int) -> int:
    """Flip byte ``offset`` of ``file``; returns the CRC-32 of its 2 MiB chunk afterwards."""
    with open(file, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
        start = offset - offset % LAYER_BYTES
        f.seek(start)
        return zlib.crc32(f.read(LAYER_BYTES))


def test_a_truncated_bank_file_names_the_file_and_offset(packed_copy) -> None:
    dst = packed_copy(VARIANT)
    data = dst / "experts.ftw"
    os.truncate(data, 10_000_000)
    with pytest.raises(ValueError) as err:
        load_model(dst)
    assert str(err.value) == (f"{data}: truncated: bank 'down' needs bytes 8388608..12582912 but "
                              f"the file ends at byte offset 10000000")


def test_a_manifest_version_we_do_not_read_is_refused(packed_copy) -> None:
    dst = packed_copy(VARIANT)
    file = dst / "freetoken-packed.json"
    raw = json.loads(file.read_text())
    raw["version"] = 2
    file.write_text(json.dumps(raw))
    with pytest.raises(ValueError) as err:
        load_model(dst)
    assert str(err.value) == (f"{file}: packed format version 2 is not readable by this "
                              f"FreeToken (it reads version 1); convert the source checkpoint "
                              f"again with `freetoken convert`")


@pytest.mark.parametrize("moe", [None, MoeConfig(backend="offload", cache="2")],
                         ids=["resident", "offload"])
def test_a_checksum_mismatch_names_the_file_and_chunk_offset(packed_copy, moe) -> None:
    dst = packed_copy(VARIANT)
    data = dst / "experts.ftw"
    crc = _flip(data, 3 * LAYER_BYTES + 12345)
    stored = read_manifest(dst).banks[0].crc32[3]
    with pytest.raises(ValueError) as err:
        load_model(dst, moe=moe)
    assert str(err.value) == (f"{data}: checksum mismatch in bank 'gate_up', chunk at byte offset "
                              f"6291456 (2097152 bytes): crc32 {crc:08x}, manifest says "
                              f"{stored:08x}; the file is corrupt, convert the checkpoint again")


def test_a_missing_bank_file_is_named(packed_copy) -> None:
    dst = packed_copy(VARIANT)
    (dst / "experts.ftw").unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_model(dst)
    assert str(err.value) == (f"{dst / 'experts.ftw'}: bank file missing (bank 'gate_up' of "
                              f"{dst / 'freetoken-packed.json'})")


def test_a_file_cut_short_while_reading_names_the_offset(tmp_path) -> None:
    """The reader's own check (a file shortened after the manifest was checked)."""
    import torch

    file = tmp_path / "bank.bin"
    file.write_bytes(bytes(5000))
    dest = torch.empty(8192, dtype=torch.uint8)
    with ChunkReader() as reader, pytest.raises(ValueError) as err:
        reader.read([ChunkRead(file, 0, dest, 0, "down")])
    assert str(err.value) == (f"{file}: truncated: bank 'down' chunk at byte offset 0 needs 8192 "
                              f"bytes but the file ends at byte offset 5000")


def _serve(tmp_path: Path, model: Path) -> tuple[int, list[str]]:
    """Run ``freetoken serve --model model`` until it exits."""
    port = free_port()
    cmd = [sys.executable, "-m", "freetoken", "serve", "--port", str(port), "--model", str(model)]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                start_new_session=True)
    server = ServerProcess(proc, port, log, "tiny", 8)
    try:
        code = proc.wait(120)
    finally:
        server.stop()
    return code, server.log_tail(100_000).splitlines()


def test_serve_refuses_a_truncated_packed_checkpoint_before_serving(packed_copy,
                                                                     tmp_path) -> None:
    dst = packed_copy(VARIANT)
    os.truncate(dst / "experts.ftw", 10_000_000)
    code, lines = _serve(tmp_path, dst)
    assert code == 2, "\n".join(lines)
    assert [line for line in lines if line.startswith("[freetoken] error:")] == [
        f"[freetoken] error: cannot load {dst}: {dst / 'experts.ftw'}: truncated: bank 'down' "
        f"needs bytes 8388608..12582912 but the file ends at byte offset 10000000"]
    assert not any("listening on" in line for line in lines)


def test_serve_exits_2_on_a_checksum_mismatch_found_while_loading(packed_copy, tmp_path) -> None:
    dst = packed_copy(VARIANT)
    data = dst / "experts.ftw"
    crc = _flip(data, LAYER_BYTES)
    stored = read_manifest(dst).banks[0].crc32[1]
    code, lines = _serve(tmp_path, dst)
    assert code == 2, "\n".join(lines)
    assert [line for line in lines if line.startswith("[freetoken] error:")] == [
        f"[freetoken] error: cannot load {dst}: {data}: checksum mismatch in bank 'gate_up', "
        f"chunk at byte offset 2097152 (2097152 bytes): crc32 {crc:08x}, manifest says "
        f"{stored:08x}; the file is corrupt, convert the checkpoint again"]
    assert not any("Traceback" in line for line in lines)


def test_a_bank_shape_that_does_not_match_its_length_is_refused(packed_copy) -> None:
    dst = packed_copy(VARIANT)
    file = dst / "freetoken-packed.json"
    raw = json.loads(file.read_text())
    bank = raw["banks"][1]
    length, bank["shape"] = bank["length"], [bank["shape"][0], 7, *bank["shape"][2:]]
    file.write_text(json.dumps(raw))
    with pytest.raises(ValueError) as err:
        load_model(dst)
    size = 1
    for d in bank["shape"]:
        size *= d
    size *= {"bfloat16": 2, "float32": 4, "uint8": 1, "float8_e4m3fn": 1}[bank["dtype"]]
    assert str(err.value) == (
        f"{file}: malformed manifest (ValueError(\"bank {bank['name']!r}: shape {bank['shape']} "
        f"of {bank['dtype']} is {size} bytes, length says {length}\"))")
