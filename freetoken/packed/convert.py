"""``freetoken convert SRC DST``: write a packed checkpoint (see ``packed.manifest``).

The routed experts are read once into :class:`~freetoken.offload.banks.ExpertBanks` exactly as
the runtime builds them (leading dim ``l * E + e``, gpt-oss's gate / up rows de-interleaved,
MXFP4 / NVFP4 / FP8 experts as stored, other experts dense: bf16 when all are stored in bf16,
else fp32, so a load in either compute dtype gets the values a safetensors load gets) and
written as banks; the other tensors are copied as stored into safetensors, and every other top-level file (config,
tokenizer, chat template) beside them. The manifest is written last: an interrupted conversion
is not taken for a packed checkpoint.
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from freetoken.models.config import ModelConfig
from freetoken.models.loader import INDEX_FILE, SINGLE_FILE, Checkpoint, check_shapes, copy_weights
from freetoken.offload.banks import ExpertBanks
from freetoken.offload.loading import first_expert_tensor, stored_expert_format
from freetoken.packed.banks import bank_dtype_name, bank_tensors
from freetoken.packed.manifest import (
    ALIGN,
    CHUNK_BYTES,
    DATA_FILE,
    MANIFEST_FILE,
    VERSION,
    PackedBank,
    PackedManifest,
)

SHARD_BYTES = 4 * 2**30  # non-expert safetensors shards
_SKIPPED = (".safetensors", INDEX_FILE, MANIFEST_FILE, DATA_FILE)


def convert(src: str | Path, dst: str | Path, say: Callable[[str], None] = lambda _m: None,
            chunk_bytes: int = CHUNK_BYTES) -> PackedManifest:
    """Write the packed form of checkpoint ``src`` into the new or empty directory ``dst``.

    Holds the routed experts once in memory (as the runtime's banks) while writing them.

    Nothing is left in ``dst`` when writing fails or is interrupted (the directory is removed
    when this call created it, else emptied again), so the same command can be run again.

    Raises:
        FileNotFoundError: ``src`` does not exist or is not a checkpoint (see ``Checkpoint``).
        ValueError: ``src`` is packed already, has no MoE layer, or the loader refuses it;
            ``dst`` is a file, or a directory that is not empty, or inside ``src``.
        OSError: ``dst`` cannot be written (disk full, permissions).
    """
    from freetoken.models.registry import with_modelopt_config

    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise FileNotFoundError(f"{src} does not exist")
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a directory: give the checkpoint's directory")
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} is not a checkpoint directory (no config.json)")
    raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config = ModelConfig.from_hf(with_modelopt_config(src, raw))
    plain = Checkpoint.for_config(src, config)
    if plain.packed is not None:
        raise ValueError(f"{src} is a packed checkpoint already")
    if dst.exists() and not dst.is_dir():
        raise ValueError(f"{dst} is a file: give a new or empty directory")
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"{dst} exists and is not an empty directory")
    if dst.resolve().is_relative_to(src.resolve()):
        raise ValueError(f"{dst} is inside {src}: write the packed checkpoint elsewhere")
    stored = stored_expert_format(plain, config)
    checkpoint = Checkpoint.for_config(src, config, raw_experts=stored is not None)
    moe_layers = tuple(i for i in range(config.num_hidden_layers) if config.is_moe_layer(i))
    if not moe_layers:
        raise ValueError(f"{src}: the model has no MoE layers to pack")
    swiglu = (config.swiglu_limit, config.swiglu_alpha) if config.expert_bias else None

    def banks_of(dtype: torch.dtype, layers: int) -> ExpertBanks:
        return ExpertBanks(layers, config.num_experts, config.hidden_size,
                           config.moe_intermediate_size, dtype, stored or "dense", swiglu,
                           config.quant_block)

    def targets_of(banks: ExpertBanks) -> dict:
        targets = {}
        for layer, i in enumerate(moe_layers):
            p = f"model.layers.{i}.mlp.experts."
            targets.update(banks.weight_targets(layer if banks.num_layers > 1 else 0, p))
        return targets

    one = banks_of(torch.float32, 1)  # the names only: a layer's worth of memory
    bf16 = stored is None and all(plain.dtype(n) == "BF16" for n in targets_of(one)
                                  if not n.endswith("_bias"))
    banks = banks_of(torch.bfloat16 if bf16 else torch.float32, len(moe_layers))
    targets = targets_of(banks)
    check_shapes(checkpoint, targets)
    say(f"reading {len(targets)} expert tensors of {len(moe_layers)} MoE layers from {src}")
    copy_weights(checkpoint, targets)
    created = not dst.exists()
    dst.mkdir(parents=True, exist_ok=True)
    try:
        return _write(src, dst, checkpoint, targets, banks, plain, config, moe_layers,
                      chunk_bytes, say)
    except BaseException:  # disk full, Ctrl-C: leave nothing half-written behind
        if created:
            shutil.rmtree(dst, ignore_errors=True)
        else:
            for entry in dst.iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink()
        raise


def _write(src: Path, dst: Path, checkpoint: Checkpoint, targets: dict, banks: ExpertBanks,
           plain: Checkpoint, config: ModelConfig, moe_layers: tuple[int, ...], chunk_bytes: int,
           say: Callable[[str], None]) -> PackedManifest:
    """The files of the packed checkpoint in ``dst``: banks, other weights, the source's side
    files, then the manifest."""
    expert_names = set().union(*(checkpoint.stored_names(n) for n in targets))
    packed = _write_banks(banks, dst, chunk_bytes)
    say(f"wrote {len(packed)} banks ({sum(b.length for b in packed) / 1e9:.2f} GB) to "
        f"{dst / DATA_FILE}")
    _write_other(checkpoint, expert_names, dst)
    for file in sorted(src.iterdir()):
        if file.is_file() and not file.name.endswith(_SKIPPED):
            shutil.copy2(file, dst / file.name)
    manifest = PackedManifest(
        path=dst, version=VERSION, expert_format=banks.format, dtype=bank_dtype_name(banks),
        stored_dtype=plain.dtype(first_expert_tensor(config)),
        moe_layers=moe_layers, num_experts=config.num_experts, hidden=config.hidden_size,
        intermediate=config.moe_intermediate_size,
        block=tuple(config.quant_block) if banks.format == "fp8" else None,
        biased=banks.biased, chunk_bytes=chunk_bytes, banks=packed)
    manifest.write()
    return manifest


def _write_banks(banks: ExpertBanks, dst: Path, chunk_bytes: int) -> tuple[PackedBank, ...]:
    """Write every bank tensor into ``dst / DATA_FILE`` (each at a multiple of ``ALIGN``, the
    file padded to one) with a CRC-32 per chunk of each layer."""
    out = []
    with open(dst / DATA_FILE, "wb") as f:
        for name, tensor in bank_tensors(banks).items():
            offset = f.tell()
            flat = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
            per_layer = flat.size // banks.num_layers
            crcs = []
            for layer in range(banks.num_layers):
                for start in range(0, per_layer, chunk_bytes):
                    piece = flat[layer * per_layer + start:
                                 layer * per_layer + min(start + chunk_bytes, per_layer)]
                    crcs.append(zlib.crc32(piece))
                    f.write(memoryview(piece))
            f.write(bytes(-f.tell() % ALIGN))
            out.append(PackedBank(name, DATA_FILE, tuple(tensor.shape),
                                  str(tensor.dtype).removeprefix("torch."), offset, flat.size,
                                  tuple(crcs)))
    return tuple(out)


def _write_other(checkpoint: Checkpoint, expert_names: set[str], dst: Path) -> None:
    """Copy every stored tensor that is neither a routed expert's nor ignored (MTP layers,
    vision tower) as stored, in shards of up to ``SHARD_BYTES`` written as they fill (one
    ``model.safetensors`` when it fits, else shards and an index)."""
    skip = expert_names | set(checkpoint.ignored)
    names = {n: f for n, f in checkpoint.stored_files().items() if n not in skip}
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}

    def flush() -> None:
        file = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, str(dst / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in shard})
        shard.clear()

    for file, group in Checkpoint.by_file(names).items():
        with safe_open(file, framework="pt") as f:
            for name in group:
                tensor = f.get_tensor(name)
                if shard and sum(t.nbytes for t in shard.values()) + tensor.nbytes > SHARD_BYTES:
                    flush()
                shard[name] = tensor
    flush()
    files = sorted(set(weight_map.values()))
    if len(files) == 1:
        (dst / files[0]).rename(dst / SINGLE_FILE)
        return
    (dst / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map},
                                             indent=1), encoding="utf-8")
