"""Records the engine's MoE routing as a replayable ``.npz`` trace (``--record-routing``).

File format: /work/shared/routing/README.md (read by ``evals.replay_routing.load_trace``):
``topk_ids`` int16 ``[num_tokens, num_layers, k]`` in execution order, ``meta`` (0-d JSON string:
``model``, ``num_experts``, ``top_k``, ``phase``, ``source``, ``license``, ``num_layers``),
``token_phase`` uint8 (0 prefill, 1 decode), ``seq_id`` int64 and ``step_id`` int64 (one id per
forward step, so the rows of one step replay together) per row.

Call protocol: the model runner calls :meth:`RoutingRecorder.begin_step` before each forward; each
MoE layer calls :meth:`RoutingRecorder.record` with its ``[T, k]`` ids, layers in order
``0..L-1`` (MoE layer ordinals). A forward that chunks its tokens internally calls layers
``0..L-1`` once per chunk; a layer id not above the previous one starts the next chunk. Rows are
kept as int16 numpy blocks (2 bytes per id: 4k tokens of a 48-layer top-8 model take 3 MB).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import torch

SOURCE = "freetoken --record-routing"


class RoutingRecorder:
    """Collects top-k expert ids per token and MoE layer and saves them as a routing trace.

    Thread safety: :meth:`record`/:meth:`begin_step` (engine thread) and :meth:`save` (any
    thread) take one lock; a save in the middle of a forward writes only whole chunks.

    Args:
        path: the ``.npz`` file :meth:`save` writes (parent folders are created).
        num_layers: MoE layers L (ordinals ``0..L-1``).
        num_experts: routed experts E per layer (at most 32767, ids are stored as int16).
        top_k: experts per token k.
        model: model name or path written to ``meta.model``.

    Raises:
        ValueError: a non-positive size, ``top_k > num_experts`` or ``num_experts > 32767``.
    """

    def __init__(self, path: str | Path, *, num_layers: int, num_experts: int, top_k: int,
                 model: str) -> None:
        if min(num_layers, num_experts, top_k) < 1 or top_k > num_experts:
            raise ValueError(f"need 1 <= top_k <= num_experts and num_layers >= 1, got "
                             f"L={num_layers} E={num_experts} k={top_k}")
        if num_experts > np.iinfo(np.int16).max:
            raise ValueError(f"num_experts {num_experts} does not fit the int16 trace format")
        self.path = Path(path)
        self.num_layers, self.num_experts, self.top_k, self.model = (
            num_layers, num_experts, top_k, str(model))
        self._lock = threading.Lock()
        self._blocks: list[np.ndarray] = []  # int16 [t, L, k] per finished chunk
        self._phase: list[np.ndarray] = []  # uint8 [t]
        self._seq: list[np.ndarray] = []  # int64 [t]
        self._step: list[np.ndarray] = []  # int64 [t]
        self._chunk: list[np.ndarray | None] = [None] * num_layers  # int16 [T, k] per layer
        self._last_layer = -1
        self._step_id = -1
        self._seq_id = 0
        self._phase_id: int | None = None

    @property
    def num_tokens(self) -> int:
        """Rows recorded in finished chunks."""
        with self._lock:
            return sum(b.shape[0] for b in self._blocks)

    def begin_step(self, seq_id: int, phase: int) -> None:
        """Start a forward step of sequence ``seq_id``; ``phase`` 0 prefill, 1 decode.

        Raises:
            ValueError: ``phase`` not 0 or 1.
        """
        if phase not in (0, 1):
            raise ValueError(f"phase must be 0 (prefill) or 1 (decode), got {phase!r}")
        with self._lock:
            self._flush()
            self._seq_id, self._phase_id = int(seq_id), int(phase)
            self._step_id += 1

    def record(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Store MoE layer ``layer``'s routing of the current chunk's T tokens.

        Args:
            layer: MoE layer ordinal in ``[0, num_layers)``.
            topk_ids: ``[T, k]`` integer expert ids (any device; copied to host as int16).

        Raises:
            RuntimeError: no :meth:`begin_step` yet.
            ValueError: a layer out of range, a shape other than ``[T, top_k]``, or a T different
                from the other layers of the same chunk.
        """
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} outside [0, {self.num_layers})")
        if topk_ids.dim() != 2 or topk_ids.shape[1] != self.top_k:
            raise ValueError(f"topk_ids must be [T, {self.top_k}], got {tuple(topk_ids.shape)}")
        ids = topk_ids.detach().to(device="cpu", dtype=torch.int16).numpy()
        with self._lock:
            if self._phase_id is None:
                raise RuntimeError("RoutingRecorder.record called before begin_step")
            if layer <= self._last_layer:
                self._flush()
            rows = next((c.shape[0] for c in self._chunk if c is not None), ids.shape[0])
            if ids.shape[0] != rows:
                raise ValueError(f"layer {layer} routed {ids.shape[0]} tokens, the earlier "
                                 f"layers of this chunk {rows}")
            self._chunk[layer] = ids
            self._last_layer = layer

    def _flush(self) -> None:
        """Move the pending chunk to the finished blocks (missing layers become -1). Lock held."""
        present = [c for c in self._chunk if c is not None]
        if present:
            t = present[0].shape[0]
            missing = np.full((t, self.top_k), -1, np.int16)
            block = np.stack([missing if c is None else c for c in self._chunk], axis=1)
            self._blocks.append(block)
            self._phase.append(np.full(t, self._phase_id, np.uint8))
            self._seq.append(np.full(t, self._seq_id, np.int64))
            self._step.append(np.full(t, self._step_id, np.int64))
        self._chunk = [None] * self.num_layers
        self._last_layer = -1

    def save(self) -> Path:
        """Write every finished chunk to :attr:`path` atomically (temp file, then rename).

        A chunk whose last layer has been recorded counts as finished; a chunk still missing
        layers (a save from another thread mid-forward) is left for the next save. Can be
        called any number of times; each call rewrites the whole file.

        Returns:
            the path written.
        """
        with self._lock:
            if self._chunk[-1] is not None:
                self._flush()
            for name in ("_blocks", "_phase", "_seq", "_step"):
                parts = getattr(self, name)
                if len(parts) > 1:  # compact, so repeated saves stay cheap
                    setattr(self, name, [np.concatenate(parts)])
            shape = (0, self.num_layers, self.top_k)
            ids = self._blocks[0] if self._blocks else np.zeros(shape, np.int16)
            phase = self._phase[0] if self._phase else np.zeros(0, np.uint8)
            seq = self._seq[0] if self._seq else np.zeros(0, np.int64)
            step = self._step[0] if self._step else np.zeros(0, np.int64)
        kinds = set(np.unique(phase).tolist())
        meta = {
            "model": self.model,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "num_layers": self.num_layers,
            "phase": "mixed" if len(kinds) > 1 else ("prefill" if kinds == {0} else "decode"),
            "source": SOURCE,
            "license": "generated",
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:
            np.savez_compressed(f, topk_ids=ids, meta=np.array(json.dumps(meta)),
                                token_phase=phase, seq_id=seq, step_id=step)
        os.replace(tmp, self.path)
        return self.path

    def close(self) -> Path:
        """Same as :meth:`save` (the final write at shutdown)."""
        return self.save()
