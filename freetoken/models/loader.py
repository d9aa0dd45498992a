"""Reads HF safetensors checkpoints by their real tensor names into a model's parameters.

Layouts (HF ``modeling_utils`` conventions): a single ``model.safetensors``, or a sharded
``model.safetensors.index.json`` whose ``weight_map`` names the shard of every tensor. A model
declares where each HF tensor goes with :class:`WeightTarget`; :func:`load_weights` checks the
checkpoint against that list (missing, unexpected and mis-shaped tensors are errors, ``mtp.*``
multi-token-prediction heads are ignored as transformers does) and copies with a dtype cast.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
IGNORED_PREFIXES: tuple[str, ...] = ("mtp.",)
_LIST_LIMIT = 8


@dataclass(frozen=True)
class WeightTarget:
    """Where one checkpoint tensor is copied.

    Attributes:
        dest: a parameter or a view of one (e.g. expert ``e``'s rows of a stacked
            ``[E, 2I, H]`` tensor); its shape is the shape the checkpoint tensor must have.
        rows: optional int64 permutation of dim 0 applied before the copy
            (``dest.copy_(src[rows])``), used to re-order interleaved projections at load time.
    """

    dest: torch.Tensor
    rows: torch.Tensor | None = None


class Checkpoint:
    """Tensor names, shapes and lazy reads of a checkpoint directory.

    Attributes:
        path: the checkpoint directory.
        files: tensor name -> safetensors file holding it.

    Raises (constructor):
        FileNotFoundError: neither ``model.safetensors`` nor the index exists, or the index names
            a shard that is not there.
        ValueError: the index is not valid JSON / has no ``weight_map``, or a tensor listed in
            the index is absent from its shard.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        index = self.path / INDEX_FILE
        single = self.path / SINGLE_FILE
        if index.is_file():
            self.files = self._from_index(index)
        elif single.is_file():
            with safe_open(single, framework="pt") as f:
                self.files = {name: single for name in f.keys()}
        else:
            raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {self.path}")
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._dtypes: dict[str, str] = {}
        for file, names in self.by_file(self.files).items():
            with safe_open(file, framework="pt") as f:
                present = set(f.keys())
                for name in names:
                    if name not in present:
                        raise ValueError(f"{INDEX_FILE}: tensor {name!r} is not in {file.name}")
                    piece = f.get_slice(name)
                    self._shapes[name] = tuple(piece.get_shape())
                    self._dtypes[name] = str(piece.get_dtype())

    def _from_index(self, index: Path) -> dict[str, Path]:
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{index}: not a valid safetensors index ({exc!r})") from exc
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: 'weight_map' must be an object")
        files = {}
        for name, shard in weight_map.items():
            file = self.path / shard
            if not file.is_file():
                raise FileNotFoundError(f"{INDEX_FILE}: shard {shard!r} (for {name!r}) not found")
            files[name] = file
        return files

    @staticmethod
    def by_file(files: dict[str, Path]) -> dict[Path, list[str]]:
        """Group tensor names by the file that holds them (file order is kept)."""
        grouped: dict[Path, list[str]] = defaultdict(list)
        for name, file in files.items():
            grouped[file].append(name)
        return grouped

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` as stored (KeyError if absent)."""
        return self._shapes[name]

    def dtype(self, name: str) -> str:
        """safetensors dtype code of tensor ``name`` as stored (``"BF16"``, ``"F32"``, ...;
        KeyError if absent)."""
        return self._dtypes[name]


def _names(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:_LIST_LIMIT])
    more = len(names) - _LIST_LIMIT
    return shown + (f" (and {more} more)" if more > 0 else "")


def check_weights(checkpoint: Checkpoint, targets: dict[str, WeightTarget]) -> None:
    """Validate names and shapes of ``checkpoint`` against ``targets`` without reading data.

    Raises:
        ValueError: tensors missing from the checkpoint, unexpected tensors (other than
            ``mtp.*``), or a tensor whose stored shape differs from its target's shape; the message
            names the tensors (first 8) and the checkpoint directory.
    """
    stored = {n for n in checkpoint.files if not n.startswith(IGNORED_PREFIXES)}
    missing = [n for n in targets if n not in stored]
    if missing:
        raise ValueError(
            f"checkpoint {checkpoint.path} is missing {len(missing)} tensor(s): {_names(missing)}"
        )
    unexpected = [n for n in stored if n not in targets]
    if unexpected:
        raise ValueError(
            f"checkpoint {checkpoint.path} has {len(unexpected)} unexpected tensor(s): "
            f"{_names(unexpected)}"
        )
    for name, target in targets.items():
        expected = tuple(target.dest.shape)
        if checkpoint.shape(name) != expected:
            raise ValueError(
                f"checkpoint {checkpoint.path}: tensor {name!r} has shape "
                f"{list(checkpoint.shape(name))}, expected {list(expected)}"
            )


@torch.no_grad()
def load_weights(checkpoint: Checkpoint, targets: dict[str, WeightTarget]) -> None:
    """Copy every checkpoint tensor into its target, casting to the target's dtype.

    Reads shard by shard, one tensor at a time, so peak extra memory is one tensor.

    Raises:
        ValueError: see :func:`check_weights` (checked before any data is read).
    """
    check_weights(checkpoint, targets)
    wanted = {n: f for n, f in checkpoint.files.items() if n in targets}
    for file, names in Checkpoint.by_file(wanted).items():
        with safe_open(file, framework="pt") as f:
            for name in names:
                target = targets[name]
                src = f.get_tensor(name)
                if target.rows is not None:
                    src = src.index_select(0, target.rows)
                target.dest.copy_(src)
