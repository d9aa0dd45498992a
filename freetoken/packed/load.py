"""Loading a model's weights from a plain or a packed checkpoint.

For a packed checkpoint (``freetoken convert``) the non-expert weights come from its safetensors
through the usual loader, and the routed experts from its bank file: read straight into the
runtime's host banks when they have the packed format and dtype (the offload backends, and
resident experts kept in a kernel format), else one MoE layer at a time into a staging bank and
copied (cast, or dequantised) into their targets (dense resident experts, or banks of another
dtype); so at most one layer exists twice.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from freetoken.models.load_progress import LoadProgress, LoadStep
from freetoken.models.loader import Checkpoint, WeightTarget, load_weights
from freetoken.offload.banks import ExpertBanks
from freetoken.packed.banks import empty_banks, expert_source, fill_banks, matches
from freetoken.packed.manifest import PackedManifest
from freetoken.packed.reader import ChunkReader

_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.")


def load_checkpoint(checkpoint: Checkpoint, targets: dict[str, WeightTarget],
                    progress: LoadProgress | None = None,
                    banks: Sequence[ExpertBanks] = ()) -> None:
    """Copy ``checkpoint`` into ``targets`` (``loader.load_weights`` for a plain checkpoint).

    Args:
        banks: the host banks the model's routed experts live in, in MoE-layer order (one bank
            of every layer, or one per layer); empty when the experts are parameters.
        progress: as for ``load_weights``; the banks count as one more shard.

    Raises:
        ValueError: the loader's checkpoint errors, an expert target the packed banks do not
            hold, and the packed reader's (truncated file, checksum mismatch).
    """
    manifest = checkpoint.packed
    if manifest is None:
        load_weights(checkpoint, targets, progress)
        return
    plain = {n: t for n, t in targets.items() if n in checkpoint.files}
    experts = _expert_targets(manifest, {n: t for n, t in targets.items() if n not in plain})
    plain_bytes = sum(checkpoint.nbytes(n) for n in plain)
    total = plain_bytes + manifest.nbytes
    shards = len(Checkpoint.by_file({n: checkpoint.files[n] for n in plain})) + 1

    def plain_step(s: LoadStep) -> None:
        progress(LoadStep(s.done_bytes, total, s.shard, shards, s.shard_done))

    load_weights(checkpoint, plain, plain_step if progress is not None else None)
    done = plain_bytes

    def bank_step(nbytes: int) -> None:
        nonlocal done
        done += nbytes
        if progress is not None:
            progress(LoadStep(done, total, shards, shards, done == total))

    with ChunkReader() as reader:
        if banks and all(matches(manifest, b) for b in banks) and (
                sum(b.num_layers for b in banks) == manifest.num_layers):
            first = 0
            for b in banks:
                fill_banks(manifest, reader, b, first, bank_step)
                first += b.num_layers
            return
        for k, layer in enumerate(manifest.moe_layers):
            staging = empty_banks(manifest, 1)
            fill_banks(manifest, reader, staging, k, bank_step)
            _copy_layer(staging, f"model.layers.{layer}.mlp.experts.", experts.get(layer, {}))


def _expert_targets(manifest: PackedManifest,
                    targets: dict[str, WeightTarget]) -> dict[int, dict[str, WeightTarget]]:
    """The targets the safetensors part does not hold, by decoder layer; each must be a routed
    expert tensor of a packed MoE layer."""
    by_layer: dict[int, dict[str, WeightTarget]] = {}
    outside = []
    for name, target in targets.items():
        m = _EXPERT.match(name)
        if m is None or int(m.group(1)) not in manifest.moe_layers:
            outside.append(name)
            continue
        by_layer.setdefault(int(m.group(1)), {})[name] = target
    if outside:
        shown = ", ".join(sorted(outside)[:8])
        raise ValueError(f"checkpoint {manifest.path} is missing {len(outside)} tensor(s): "
                         f"{shown}")
    return by_layer


@torch.no_grad()
def _copy_layer(staging: ExpertBanks, prefix: str, targets: dict[str, WeightTarget]) -> None:
    """Copy one filled staging layer into its targets (no ``rows`` permutation: the banks'
    rows are already in the runtime's order)."""
    sources = staging.weight_targets(0, prefix)
    for name, target in targets.items():
        try:
            src = expert_source(staging, sources, name, target.dest.dtype)
        except KeyError:
            raise ValueError(f"packed banks have no tensor {name!r}") from None
        target.dest.copy_(src)
