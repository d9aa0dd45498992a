"""Reads HF safetensors checkpoints by their real tensor names into a model's parameters.

Layouts (HF ``modeling_utils`` conventions): a single ``model.safetensors``, or a sharded
``model.safetensors.index.json`` whose ``weight_map`` names the shard of every tensor. A model
declares where each HF tensor goes with :class:`WeightTarget`; :func:`load_weights` checks the
checkpoint against that list (missing, unexpected and mis-shaped tensors are errors, ``mtp.*``
multi-token-prediction heads and ``model.visual.*`` vision towers are ignored as transformers
does) and copies with a dtype cast.

Models name tensors in one canonical form (``model.layers.N...``, per-expert
``mlp.experts.E.{gate,up,down}_proj.weight``); :class:`Checkpoint` maps the released variants onto
it: the ``model.language_model.`` prefix of multimodal releases (Qwen3.5) and, when asked, the
transformers-v5 fused expert tensors ``mlp.experts.gate_up_proj [E, 2I, H]`` (rows ``0:I`` gate,
``I:2I`` up) and ``mlp.experts.down_proj [E, H, I]``, read one expert slice at a time. gpt-oss
(``oss_experts``) keeps its fused tensors per expert under ``mlp.experts.{e}.gate_up_proj [2I, H]``
(rows still interleaved), ``down_proj [H, I]`` and their ``_bias`` rows: from the released MXFP4
``*_blocks`` / ``*_scales`` pairs (dequantised as read) or from the bf16 ``[E, in, out]`` layout
(transposed as read). NVFP4 (ModelOpt) weights are dequantised as read, or given as stored for
NVFP4 expert banks (``raw_experts``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from freetoken.models.load_progress import LoadProgress, LoadStep
from freetoken.ops.cpu_moe.quant import dequantize_mxfp4, dequantize_nvfp4
from freetoken.packed.manifest import PackedManifest, is_packed, read_manifest

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
IGNORED_PREFIXES: tuple[str, ...] = ("mtp.", "model.visual.")
TEXT_PREFIX = "model.language_model."
SCALE_SUFFIX = "_scale_inv"  # FP8 block scales: weight = fp8 values * scale per block
FP8_DTYPES = ("F8_E4M3",)
_FUSED_EXPERTS = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)")
_OSS_EXPERTS = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(_blocks|_bias)?")
MXFP4_BLOCKS, MXFP4_SCALES = "_blocks", "_scales"
# NVFP4 (ModelOpt): X.weight packed e2m1 + X.weight_scale (e4m3 per 16) + X.weight_scale_2 (fp32
# global); X.input_scale is the activation scale of 4-bit activations, not used here.
NVFP4_PARTS = ("_scale", "_scale_2")
_NVFP4_UNUSED = ".input_scale"
_EXPERT_WEIGHT = re.compile(r".*\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")
_LIST_LIMIT = 8
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "BF16": 2, "F16": 2,
                "I16": 2, "U16": 2}  # every other safetensors dtype (U8, I8, F8_*, BOOL) is 1


@dataclass(frozen=True)
class StoredSlice:
    """Where a canonical tensor lives in the files.

    Attributes:
        name: the stored tensor name.
        index: index into dim 0 of the stored tensor (one expert of a fused tensor), or None.
        rows: ``(start, stop)`` of the next dim after ``index`` (gate or up half), or None.
        scale: the ``{name}_scale_inv`` tensor of an FP8 block-quantised weight, or None.
        mxfp4_scales: the ``*_scales`` tensor of an MXFP4 ``*_blocks`` tensor, or None.
        transpose: the stored slice is ``[in, out]`` (gpt-oss bf16 experts): read transposed.
        nvfp4: ``(weight_scale, weight_scale_2)`` names of an NVFP4 weight, or None.
        expand: read a scalar as this many copies (an NVFP4 global scale per row), or None.
        raw: an FP8 weight given as stored (its scales are a tensor of their own), not
            dequantised.
    """

    name: str
    index: int | None = None
    rows: tuple[int, int] | None = None
    scale: str | None = None
    mxfp4_scales: str | None = None
    transpose: bool = False
    nvfp4: tuple[str, str] | None = None
    expand: int | None = None
    raw: bool = False


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

    Args:
        path: the checkpoint directory.
        fused_experts: expand transformers-v5 fused expert tensors into per-expert names (the
            Qwen families' layout; a family whose fused tensors differ passes False).
        mtp_from_layer: ignore ``model.layers.{i}.*`` for ``i >=`` this (the MTP layers GLM
            stores after its last decoder layer), or None.
        oss_experts: map gpt-oss expert tensors to their per-expert canonical names (see the
            module docstring) instead of the Qwen fused layout.
        raw_mxfp4: with ``oss_experts``, give MXFP4 experts as their codes and scales
            (``{e}.gate_up_proj_blocks [2I, H/32, 16]``, ``{e}.gate_up_proj_scales [2I, H/32]``,
            uint8, likewise ``down_proj``) for MXFP4 host banks, not dequantised.
        nvfp4: read NVFP4 (ModelOpt) weights, dequantised as read; with ``raw_experts`` the
            per-expert weights are given as stored for NVFP4 host banks: ``X`` uint8
            ``[R, C/2]``, ``X_scale`` e4m3 ``[R, C/16]`` and ``X_scale_2`` fp32 ``[R]`` (the
            global, one copy per row); FP8 per-expert weights likewise as ``X`` e4m3 and
            ``X_scale_inv`` fp32 block scales.
        packed: the directory's packed manifest when the caller has read it already (None:
            read here when the directory is packed).

    Attributes:
        path: the checkpoint directory.
        packed: the :class:`~freetoken.packed.manifest.PackedManifest` of a packed checkpoint
            (``freetoken convert``: the routed experts are in its bank file, not in ``files``),
            else None.
        files: canonical tensor name -> safetensors file holding it.
        ignored: stored names that are not loaded (``mtp.*``, ``model.visual.*``, MTP layers).

    Raises (constructor):
        FileNotFoundError: neither ``model.safetensors`` nor the index exists, or the index names
            a shard that is not there; a packed checkpoint's bank file is missing.
        ValueError: the index is not valid JSON / has no ``weight_map``, or a tensor listed in
            the index is absent from its shard; a packed manifest that cannot be read (see
            ``packed.manifest.read_manifest``).
    """

    def __init__(self, path: str | Path, fused_experts: bool = True,
                 mtp_from_layer: int | None = None, oss_experts: bool = False,
                 raw_mxfp4: bool = False, nvfp4: bool = False,
                 raw_experts: bool = False, packed: PackedManifest | None = None) -> None:
        self.path = Path(path)
        self._mtp_from = mtp_from_layer
        self._oss, self._raw_mxfp4 = oss_experts, raw_mxfp4
        self._nvfp4, self._raw_experts = nvfp4, raw_experts
        if packed is None and is_packed(self.path):
            packed = read_manifest(self.path)
        self.packed = packed
        index = self.path / INDEX_FILE
        single = self.path / SINGLE_FILE
        if index.is_file():
            stored = self._from_index(index)
        elif single.is_file():
            with _open(single) as f:
                stored = {name: single for name in f.keys()}
        else:
            raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {self.path}")
        self._stored_files = stored
        self.files: dict[str, Path] = {}
        self.ignored: list[str] = []
        self._source: dict[str, StoredSlice] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._dtypes: dict[str, str] = {}
        self._scales = {n for n in stored if n.endswith(SCALE_SUFFIX) or (
            oss_experts and n.endswith(MXFP4_SCALES)
            and n[: -len(MXFP4_SCALES)] + MXFP4_BLOCKS in stored) or (
            nvfp4 and any(n.endswith(".weight" + part) and n[: -len(part)] in stored
                          for part in NVFP4_PARTS))}
        unused = {n for n in stored if nvfp4 and n.endswith(_NVFP4_UNUSED)
                  and n[: -len(_NVFP4_UNUSED)] + ".weight" in stored}
        self._stored_shapes: dict[str, tuple[int, ...]] = {}
        self._scale_shapes: dict[str, tuple[int, ...]] = {}
        tensors = []  # registered once every scale shape is known (a scale may come later)
        for file, names in self.by_file(stored).items():
            with _open(file) as f:
                present = set(f.keys())
                for name in names:
                    if name not in present:
                        raise ValueError(f"{INDEX_FILE}: tensor {name!r} is not in {file.name}")
                    piece = f.get_slice(name)
                    if name in self._scales:
                        self._scale_shapes[name] = tuple(piece.get_shape())
                        continue
                    if name in unused:
                        self.ignored.append(name)
                        continue
                    tensors.append((name, file, tuple(piece.get_shape()),
                                    str(piece.get_dtype())))
        for name, file, shape, dtype in tensors:
            self._add(name, file, shape, dtype, fused_experts)
        self._check_scales(stored)

    def _add(self, name: str, file: Path, shape: tuple[int, ...], dtype: str,
             fused_experts: bool) -> None:
        """Register stored tensor ``name`` under its canonical name(s)."""
        layer = _LAYER.match(name)
        if name.startswith(IGNORED_PREFIXES) or (
                self._mtp_from is not None and layer and int(layer.group(1)) >= self._mtp_from):
            self.ignored.append(name)
            return
        self._stored_shapes[name] = shape
        text = name.startswith(TEXT_PREFIX)
        canonical = "model." + name[len(TEXT_PREFIX):] if text else name
        scale = name + SCALE_SUFFIX if name + SCALE_SUFFIX in self._scales else None
        if self._nvfp4 and name + NVFP4_PARTS[0] in self._scales:
            self._add_nvfp4(name, canonical, file, shape)
            return
        if self._nvfp4 and dtype == "U8" and name.endswith(".weight"):
            raise ValueError(f"checkpoint {self.path}: NVFP4 weight {name!r} has no "
                             f"{name + NVFP4_PARTS[0]!r}")
        oss = _OSS_EXPERTS.fullmatch(canonical) if self._oss else None
        if oss is not None and len(shape) >= 2:
            self._add_oss(name, oss.groups(), file, shape, dtype)
            return
        if scale is not None and self._raw_experts and _EXPERT_WEIGHT.fullmatch(canonical):
            self._put(canonical, StoredSlice(name, raw=True), file, shape, dtype)
            self._put(canonical + SCALE_SUFFIX, StoredSlice(scale), self._stored_files[scale],
                      self._scale_shapes[scale], "F32")
            return
        fused = _FUSED_EXPERTS.fullmatch(canonical) if fused_experts else None
        if fused is None or len(shape) != 3:
            self._put(canonical, StoredSlice(name, scale=scale), file, shape, dtype)
            return
        base, kind = fused.groups()
        for e in range(shape[0]):
            if kind == "down_proj":
                self._put(f"{base}.{e}.down_proj.weight", StoredSlice(name, e, scale=scale),
                          file, shape[1:], dtype)
                continue
            if shape[1] % 2:
                raise ValueError(f"checkpoint {self.path}: fused tensor {name!r} has an odd "
                                 f"gate_up dim {shape[1]}")
            half = shape[1] // 2
            for proj, rows in (("gate_proj", (0, half)), ("up_proj", (half, shape[1]))):
                self._put(f"{base}.{e}.{proj}.weight", StoredSlice(name, e, rows, scale),
                          file, (half, shape[2]), dtype)

    def _add_oss(self, name: str, parts: tuple, file: Path, shape: tuple[int, ...],
                 dtype: str) -> None:
        """Register a gpt-oss expert tensor per expert: ``{base}.{e}.{proj}[_bias]``."""
        base, proj, kind = parts
        if kind == MXFP4_BLOCKS:
            scales = name[: -len(MXFP4_BLOCKS)] + MXFP4_SCALES
            grid = self._scale_shapes.get(scales)
            if len(shape) != 4 or shape[3] != 16 or grid != shape[:3]:
                raise ValueError(f"checkpoint {self.path}: MXFP4 tensor {name!r} {list(shape)} "
                                 f"needs [E, R, C/32, 16] blocks and {scales!r} [E, R, C/32], "
                                 f"got {list(grid) if grid else 'none'}")
            for e in range(shape[0]):
                if self._raw_mxfp4:
                    self._put(f"{base}.{e}.{proj}{MXFP4_BLOCKS}", StoredSlice(name, e), file,
                              shape[1:], "U8")
                    self._put(f"{base}.{e}.{proj}{MXFP4_SCALES}", StoredSlice(scales, e),
                              self._stored_files[scales], shape[1:3], "U8")
                    continue
                self._put(f"{base}.{e}.{proj}", StoredSlice(name, e, mxfp4_scales=scales),
                          file, (shape[1], shape[2] * 32), "MXFP4")
            return
        if kind is None and len(shape) != 3:
            raise ValueError(f"checkpoint {self.path}: expert tensor {name!r} has shape "
                             f"{list(shape)}, expected [E, in, out]")
        suffix = "_bias" if kind == "_bias" else ""
        per = shape[1:] if kind == "_bias" else (shape[2], shape[1])
        for e in range(shape[0]):
            self._put(f"{base}.{e}.{proj}{suffix}",
                      StoredSlice(name, e, transpose=kind is None), file, per, dtype)

    def _add_nvfp4(self, name: str, canonical: str, file: Path,
                   shape: tuple[int, ...]) -> None:
        """Register an NVFP4 weight (2-D: ModelOpt writes every expert apart)."""
        scale, global_ = (name + part for part in NVFP4_PARTS)
        rows, cols = (shape[0], 2 * shape[1]) if len(shape) == 2 else (0, 0)
        if global_ not in self._scale_shapes:
            raise ValueError(f"checkpoint {self.path}: NVFP4 weight {name!r} has no {global_!r}")
        if (len(shape) != 2 or self._scale_shapes[scale] != (rows, cols // 16)
                or self._scale_shapes[global_] not in ((), (1,))):
            raise ValueError(f"checkpoint {self.path}: NVFP4 tensor {name!r} {list(shape)} "
                             f"needs [R, C/2] values, {scale!r} [R, C/16] and a scalar "
                             f"{global_!r}, got {list(self._scale_shapes[scale])} and "
                             f"{list(self._scale_shapes.get(global_, ['none']))}")
        if self._raw_experts and _EXPERT_WEIGHT.fullmatch(canonical):
            self._put(canonical, StoredSlice(name), file, shape, "U8")
            self._put(canonical + NVFP4_PARTS[0], StoredSlice(scale),
                      self._stored_files[scale], (rows, cols // 16), "F8_E4M3")
            self._put(canonical + NVFP4_PARTS[1], StoredSlice(global_, expand=rows),
                      self._stored_files[global_], (rows,), "F32")
            return
        self._put(canonical, StoredSlice(name, nvfp4=(scale, global_)), file, (rows, cols),
                  "NVFP4")

    def _check_scales(self, stored: dict[str, Path]) -> None:
        """Every FP8 tensor has a block-scale grid that divides it, and every scale a weight."""
        known = set(self._stored_shapes) | set(self.ignored)
        for scale in self._scales:
            if not scale.endswith(SCALE_SUFFIX):
                continue  # MXFP4 / NVFP4 scales: paired with their weights when registered
            if scale[: -len(SCALE_SUFFIX)] not in known:
                raise ValueError(f"checkpoint {self.path}: {scale!r} scales no tensor")
        for canonical, source in self._source.items():
            nvfp4_scale = self._nvfp4 and source.name.endswith(".weight" + NVFP4_PARTS[0])
            if self._dtypes[canonical] not in FP8_DTYPES or nvfp4_scale or source.raw:
                continue
            if source.scale is None and source.name.endswith(".weight" + NVFP4_PARTS[0]):
                raise ValueError(f"checkpoint {self.path}: {source.name!r} looks like an NVFP4 "
                                 f"(ModelOpt) scale, but neither config.json's "
                                 f"quantization_config nor hf_quant_config.json declares NVFP4")
            if source.scale is None:
                raise ValueError(f"checkpoint {self.path}: FP8 tensor {source.name!r} has no "
                                 f"{source.name + SCALE_SUFFIX!r}")

    def _put(self, canonical: str, source: StoredSlice, file: Path, shape: tuple[int, ...],
             dtype: str) -> None:
        if canonical in self.files:
            raise ValueError(f"checkpoint {self.path}: tensor {canonical!r} is stored twice "
                             f"(as {self._source[canonical].name!r} and {source.name!r})")
        self.files[canonical] = file
        self._source[canonical] = source
        self._shapes[canonical] = shape
        self._dtypes[canonical] = dtype

    @classmethod
    def for_config(cls, path: str | Path, config, raw_experts: bool = False,
                   packed: PackedManifest | None = None) -> "Checkpoint":
        """The checkpoint at ``path`` read as ``config`` (a ``ModelConfig``) says: GLM's MTP
        layers skipped, gpt-oss's expert names, NVFP4 weights; ``raw_experts`` gives quantised
        routed experts as stored (MXFP4, NVFP4) for host banks in that format; ``packed``: its
        packed manifest, when already read."""
        return cls(path, mtp_from_layer=config.num_hidden_layers if config.mtp_layers else None,
                   oss_experts=config.model_type == "gpt_oss",
                   raw_mxfp4=raw_experts and config.quant_method == "mxfp4",
                   nvfp4=config.quant_method == "nvfp4", raw_experts=raw_experts, packed=packed)

    def read(self, handle, name: str) -> torch.Tensor:
        """Tensor ``name`` (canonical) read from ``handle``, the open ``safe_open`` of
        ``files[name]``; a fused expert's slice reads only that expert's bytes."""
        source = self._source[name]
        value = self._slice(handle, source.name, source.index, source.rows)
        if source.expand is not None:
            return value.reshape(()).expand(source.expand)
        if source.nvfp4 is not None:
            scale, global_ = (self._other(handle, name, n) for n in source.nvfp4)
            return dequantize_nvfp4(value, scale, global_.reshape(()).expand(value.shape[0]))
        if source.mxfp4_scales is not None:
            scales = self._slice(handle, source.mxfp4_scales, source.index, None)
            return dequantize_mxfp4(value, scales)
        if source.transpose:
            return value.t()
        if source.scale is None or source.raw:
            return value
        grid = self._scale_shapes[source.scale][-2:]
        shape = self._stored_shapes[source.name][-2:]
        if shape[-2] % grid[0] or shape[-1] % grid[1]:
            raise ValueError(f"checkpoint {self.path}: {source.name!r} {list(shape)} is not "
                             f"divisible by its scale grid {list(grid)}")
        block = (shape[-2] // grid[0], shape[-1] // grid[1])
        rows = None if source.rows is None else (source.rows[0] // block[0],
                                                 source.rows[1] // block[0])
        if source.rows is not None and (source.rows[0] % block[0] or source.rows[1] % block[0]):
            raise ValueError(f"checkpoint {self.path}: {source.name!r}: the gate / up halves "
                             f"do not fall on {block[0]}-row scale blocks")
        scales = self._slice(handle, source.scale, source.index, rows)
        return dequantize_blocks(value, scales)

    def _other(self, handle, name: str, other: str) -> torch.Tensor:
        """Stored tensor ``other`` read beside canonical ``name`` (``handle`` is its file's):
        from the same handle when both share a shard, else from ``other``'s shard."""
        if self._stored_files[other] == self.files[name]:
            return handle.get_tensor(other)
        with _open(self._stored_files[other]) as f:
            return f.get_tensor(other)

    @staticmethod
    def _slice(handle, name: str, index: int | None,
               rows: tuple[int, int] | None) -> torch.Tensor:
        if index is None:
            return handle.get_tensor(name)
        piece = handle.get_slice(name)
        if rows is None:
            return piece[index : index + 1][0]
        return piece[index : index + 1, rows[0] : rows[1]][0]

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

    def nbytes(self, name: str) -> int:
        """Stored bytes of tensor ``name`` (a fused expert's slice: its own bytes)."""
        count = 1
        for d in self._shapes[name]:
            count *= d
        if self._dtypes[name] == "MXFP4":  # 16 bytes of codes + 1 scale byte per 32 values
            return count * 17 // 32
        if self._dtypes[name] == "NVFP4":  # 8 bytes of codes + 1 scale byte per 16 values
            return count * 9 // 16
        return count * _DTYPE_BYTES.get(self._dtypes[name], 1)

    def stored_files(self) -> dict[str, Path]:
        """Every stored tensor name -> its file (ignored ones included)."""
        return dict(self._stored_files)

    def stored_names(self, name: str) -> set[str]:
        """The stored tensors canonical tensor ``name`` is read from (its values and any
        scales)."""
        source = self._source[name]
        names = {source.name, source.scale, source.mxfp4_scales, *(source.nvfp4 or ())}
        return {n for n in names if n is not None}

    def fused(self, name: str) -> bool:
        """Whether canonical tensor ``name`` is a slice of a fused (stacked) stored tensor."""
        return self._source[name].index is not None

    def dtype(self, name: str) -> str:
        """safetensors dtype code of tensor ``name`` as stored (``"BF16"``, ``"F32"``, ...;
        ``"MXFP4"`` for a blocks / scales pair; KeyError if absent)."""
        return self._dtypes[name]


def _open(file: Path):
    """``safe_open`` of ``file``; a truncated or corrupt file is a ValueError naming it."""
    try:
        return safe_open(file, framework="pt")
    except Exception as exc:  # safetensors raises its own SafetensorError (an Exception)
        raise ValueError(f"{file}: not a readable safetensors file (truncated or corrupt: "
                         f"{exc})") from None


def dequantize_blocks(weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """FP8 block dequantisation: ``weight [R, C]`` (fp8) times ``scales [R / bm, C / bn]``
    expanded over its ``bm x bn`` blocks, in fp32 (transformers ``Fp8Dequantize``).

    Raises:
        ValueError: the scale grid does not divide the weight.
    """
    rows, cols = weight.shape[-2:]
    grid_r, grid_c = scales.shape[-2:]
    if rows % grid_r or cols % grid_c:
        raise ValueError(f"weight {list(weight.shape)} is not divisible by its scale grid "
                         f"{list(scales.shape)}")
    q = weight.float().reshape(grid_r, rows // grid_r, grid_c, cols // grid_c)
    return (q * scales.float()[:, None, :, None]).reshape(rows, cols)


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
    stored = set(checkpoint.files)
    _check_missing(checkpoint, targets)
    unexpected = [n for n in stored if n not in targets]
    if unexpected:
        raise ValueError(
            f"checkpoint {checkpoint.path} has {len(unexpected)} unexpected tensor(s) (other "
            f"than {', '.join(p + '*' for p in IGNORED_PREFIXES)}): "
            f"{_names(unexpected)}"
        )
    check_shapes(checkpoint, targets)


def _check_missing(checkpoint: Checkpoint, targets: dict[str, WeightTarget]) -> None:
    missing = [n for n in targets if n not in checkpoint.files]
    if missing:
        raise ValueError(
            f"checkpoint {checkpoint.path} is missing {len(missing)} tensor(s): {_names(missing)}"
        )


def check_shapes(checkpoint: Checkpoint, targets: dict[str, WeightTarget]) -> None:
    """Every target is in ``checkpoint`` with its shape (other stored tensors are not checked).

    Raises:
        ValueError: as :func:`check_weights`, for missing and mis-shaped tensors.
    """
    _check_missing(checkpoint, targets)
    for name, target in targets.items():
        expected = tuple(target.dest.shape)
        if checkpoint.shape(name) != expected:
            raise ValueError(
                f"checkpoint {checkpoint.path}: tensor {name!r} has shape "
                f"{list(checkpoint.shape(name))}, expected {list(expected)}"
            )


@torch.no_grad()
def load_weights(checkpoint: Checkpoint, targets: dict[str, WeightTarget],
                 progress: LoadProgress | None = None) -> None:
    """Copy every checkpoint tensor into its target, casting to the target's dtype.

    Reads shard by shard, one tensor at a time, so peak extra memory is one tensor; a shard that
    holds no loaded tensor is not read.

    Args:
        progress: called with a :class:`~freetoken.models.load_progress.LoadStep` after every
            tensor, or None.

    Raises:
        ValueError: see :func:`check_weights` (checked before any data is read).
    """
    check_weights(checkpoint, targets)
    copy_weights(checkpoint, targets, progress)


@torch.no_grad()
def copy_weights(checkpoint: Checkpoint, targets: dict[str, WeightTarget],
                 progress: LoadProgress | None = None) -> None:
    """:func:`load_weights` without its checks: copy the tensors ``targets`` names (each must
    be in ``checkpoint``, shaped as its target: :func:`check_shapes`)."""
    wanted = {n: f for n, f in checkpoint.files.items() if n in targets}
    shards = Checkpoint.by_file(wanted)
    total = sum(checkpoint.nbytes(n) for n in wanted)
    done = 0
    for index, (file, names) in enumerate(shards.items(), start=1):
        with _open(file) as f:
            for i, name in enumerate(names):
                target = targets[name]
                src = checkpoint.read(f, name)
                if target.rows is not None:
                    src = src.index_select(0, target.rows)
                target.dest.copy_(src)
                done += checkpoint.nbytes(name)
                if progress is not None:
                    progress(LoadStep(done, total, index, len(shards), i + 1 == len(names)))
