"""A scripted stand-in model for the prefix-reuse benchmark (``evals/bench_prefix.py``).

:class:`ScriptedLM` implements what ``freetoken.engine`` uses of a ``DecoderLM`` (``kv_layout``,
``recurrent_layout``, ``new_paged_state``, ``recurrent_tensors``, ``forward_batch``,
``new_state``), so a replay runs through the real scheduler, radix tree, checkpoint store and
retention. Its output is scripted: before each request the benchmark sets the token ids of the
recorded reply (:class:`ReplyScript`), and the model emits them, then EOS is part of the reply.

Its "recurrent state" is one int64 tensor ``[2]``: a 64-bit polynomial hash of every token the
sequence has consumed and their count. A checkpoint restored at the wrong depth, or holding the
state of another sequence, therefore changes what the model emits (the benchmark compares every
output with the script) or raises at the next forward (count mismatch): the replay checks the
engine's reuse decisions as it measures them.

Two modes:

* ``inner=None`` (``--model null``): no computation at all; KV layout 1 layer x 1 KV head x
  head_dim 1 fp32, so a whole-trace replay costs only the engine's bookkeeping.
* ``inner=<DecoderLM>`` (``--model tiny``): the real model runs every forward (its KV pages, Gated
  DeltaNet states and checkpoints are the real ones, TTFT is real); only the sampled logits are
  replaced by the script, so the replayed conversation is the recorded one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from freetoken.models.base import CausalLM, SequenceState
from freetoken.prefix.checkpoints import RecurrentLayout
from freetoken.prefix.kv_pool import KVLayout

MASK = (1 << 64) - 1
BASE = 0x9E3779B97F4A7C15  # odd 64-bit multiplier (golden-ratio constant)
SCRIPT_STATE = ((2,), torch.int64)
"""Layout entry of the script state tensor: ``[hash (int64 bit pattern), tokens consumed]``."""


class TokenHash:
    """``h(ids) = sum_i (ids[i] + 1) * BASE**(n-1-i) mod 2**64``, extendable chunk by chunk.

    Powers of ``BASE`` are kept as a uint64 numpy array grown on demand (numpy integer arrays
    wrap modulo 2**64, which is the hash's modulus).
    """

    def __init__(self) -> None:
        self._pows = np.ones(1, dtype=np.uint64)

    def _powers(self, n: int) -> np.ndarray:
        while self._pows.shape[0] <= n:
            m = self._pows.shape[0]
            step = np.uint64(pow(BASE, m, 1 << 64))
            self._pows = np.concatenate([self._pows, self._pows * step])
        return self._pows

    def extend(self, h: int, ids: np.ndarray | Sequence[int]) -> int:
        """Hash of ``seq + ids`` given ``h`` = hash of ``seq`` (Python ints in ``[0, 2**64)``)."""
        arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = arr.shape[0]
        if n == 0:
            return h
        pows = self._powers(n)
        s = int(((arr.astype(np.uint64) + np.uint64(1)) * pows[n - 1::-1]).sum(dtype=np.uint64))
        return (h * int(pows[n]) + s) & MASK

    @staticmethod
    def step(h: int, token: int) -> int:
        """Hash after appending one token."""
        return (h * BASE + token + 1) & MASK


def _signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def _attach(state: SequenceState, device: torch.device) -> SequenceState:
    """Give ``state`` a zero script state tensor (and, on the CPU, a numpy view of it)."""
    state.script_rec = torch.zeros(2, dtype=torch.int64, device=device)
    state.script_view = state.script_rec.numpy() if state.script_rec.device.type == "cpu" else None
    return state


def _write(state: SequenceState, h: int, count: int) -> None:
    """Store ``(hash, count)`` into the state's script tensor."""
    view = state.script_view
    if view is not None:
        view[0], view[1] = _signed(h), count
    else:
        state.script_rec.copy_(torch.tensor([_signed(h), count], dtype=torch.int64))


def _read(state: SequenceState) -> tuple[int, int]:
    """``(hash as an unsigned 64-bit int, count)`` of the state's script tensor."""
    view = state.script_view
    h, count = (int(view[0]), int(view[1])) if view is not None else state.script_rec.tolist()
    return h & MASK, count


class ReplyScript:
    """The current request's scripted output: the next token after each prefix of
    ``prompt + reply``, keyed by the prefix's :class:`TokenHash`.

    Requests are replayed one at a time, so the script holds one request at a time.
    """

    def __init__(self, hasher: TokenHash | None = None) -> None:
        self.hasher = hasher or TokenHash()
        self._next: dict[int, int] = {}

    def set(self, prompt_ids: Sequence[int], reply_ids: Sequence[int]) -> None:
        """Script ``reply_ids`` (at least one id) after ``prompt_ids``.

        Raises:
            ValueError: empty prompt or reply.
        """
        if not prompt_ids or not reply_ids:
            raise ValueError("the script needs a non-empty prompt and reply")
        h = self.hasher.extend(0, prompt_ids)
        table = {h: int(reply_ids[0])}
        for k in range(len(reply_ids) - 1):
            h = TokenHash.step(h, int(reply_ids[k]))
            table[h] = int(reply_ids[k + 1])
        self._next = table

    def next_token(self, h: int) -> int | None:
        """The scripted token after the sequence hashing to ``h``, or None (not on the script)."""
        return self._next.get(h)


@dataclass(frozen=True)
class NullConfig:
    """The stand-in's config (what the benchmark reads of a model config)."""

    vocab_size: int
    eos_token_id: int
    max_position_embeddings: int = 1 << 22
    model_type: str = "null"


class ScriptState(SequenceState):
    """State of one sequence in the null mode: tokens consumed + the script state tensor."""

    def __init__(self, num_tokens: int = 0) -> None:
        self.num_tokens = num_tokens
        _attach(self, torch.device("cpu"))


class ScriptedLM(CausalLM):
    """Scripted stand-in (``inner=None``) or scripted wrapper around a real ``DecoderLM``.

    Args:
        script: the reply script the benchmark sets before each request.
        config: vocabulary size (of the null mode's logits) and the EOS id emitted off-script.
        inner: a real hybrid model whose forwards run (``--model tiny``), or None.

    Logits: ``[B, V]`` float32, 0 everywhere and 1 at the scripted token (greedy sampling picks
    it); a sequence not on the script gets EOS (the benchmark then reports the mismatch).
    """

    def __init__(self, script: ReplyScript, config: NullConfig,
                 inner: CausalLM | None = None) -> None:
        super().__init__()
        self.script = script
        self.inner = inner
        self.config = config
        self.register_buffer("_device_marker", torch.zeros(1), persistent=False)
        self._buffer: torch.Tensor | None = None

    # ------------------------------------------------------------------ layouts and states
    def kv_layout(self) -> KVLayout | None:
        """The inner model's KV layout, or 1 layer x 1 KV head x head_dim 1 fp32 (null mode)."""
        if self.inner is not None:
            return self.inner.kv_layout()
        return KVLayout(num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32)

    def recurrent_layout(self) -> RecurrentLayout:
        """The inner model's recurrent tensors followed by the script state ``[2]`` int64."""
        inner = self.inner.recurrent_layout().shapes if self.inner is not None else ()
        return RecurrentLayout(tuple(inner) + (SCRIPT_STATE,))

    def new_paged_state(self, pool, table, num_tokens: int = 0) -> SequenceState:
        """A state starting after ``num_tokens`` reused positions (script state zero until a
        checkpoint is copied into :meth:`recurrent_tensors`)."""
        if self.inner is None:
            return ScriptState(num_tokens)
        return _attach(self.inner.new_paged_state(pool, table, num_tokens),
                       self._device_marker.device)

    def new_state(self) -> SequenceState:
        """An empty contiguous state (engines without a prefix cache)."""
        if self.inner is None:
            return ScriptState()
        return _attach(self.inner.new_state(), self._device_marker.device)

    def recurrent_tensors(self, state: SequenceState) -> list[torch.Tensor]:
        """Live recurrent tensors: the inner model's, then the script state."""
        inner = self.inner.recurrent_tensors(state) if self.inner is not None else []
        return list(inner) + [state.script_rec]

    # ------------------------------------------------------------------ forward
    def forward_batch(self, inputs: list[torch.Tensor],
                      states: list[SequenceState]) -> torch.Tensor:
        """Consume each sequence's chunk; ``[B, V]`` fp32 scripted logits of the last positions.

        Raises:
            RuntimeError: a state's script count differs from its ``num_tokens`` (a checkpoint
                restored at the wrong depth).
            ValueError: mismatched list lengths (as ``CausalLM.forward_batch``).
        """
        if torch.is_inference_mode_enabled():
            return self._step(inputs, states, None)[0]
        with torch.inference_mode():
            return self._step(inputs, states, None)[0]

    def forward_batch_capture(self, inputs: list[torch.Tensor], states: list[SequenceState],
                              capture: list[tuple[int, ...]]
                              ) -> tuple[torch.Tensor, list[dict[int, list[torch.Tensor]]]]:
        """:meth:`forward_batch` plus copies of the recurrent tensors (:meth:`recurrent_tensors`
        order) at the absolute positions ``capture[i]`` inside each chunk
        (``DecoderLM.forward_batch_capture``'s contract).

        Raises:
            ValueError: ``capture`` is not one entry per sequence; as :meth:`forward_batch`.
        """
        if not isinstance(capture, (list, tuple)) or len(capture) != len(inputs):
            raise ValueError("forward_batch_capture needs one capture tuple per sequence")
        if torch.is_inference_mode_enabled():
            return self._step(inputs, states, capture)
        with torch.inference_mode():
            return self._step(inputs, states, capture)

    def _step(self, inputs, states, capture):
        if len(inputs) != len(states) or not inputs:
            raise ValueError(f"forward_batch got {len(inputs)} inputs and {len(states)} states")
        for state in states:
            n, count = state.num_tokens, _read(state)[1]
            if count != n:
                raise RuntimeError(f"script state holds {count} tokens but the sequence state "
                                   f"{n}: a recurrent checkpoint was restored at the wrong depth")
        snapshots = None
        if self.inner is not None:
            if capture is not None:
                real, snapshots = self.inner.forward_batch_capture(inputs, states, capture)
            else:
                real = self.inner.forward_batch(inputs, states)
            vocab, device = real.shape[-1], real.device
        else:
            vocab, device = self.config.vocab_size, self._device_marker.device
        if capture is not None and snapshots is None:
            snapshots = [{} for _ in inputs]
        logits = self._logits(len(inputs), vocab, device)
        for row, (ids, state) in enumerate(zip(inputs, states)):
            h, count = _read(state)
            if capture is not None:
                self._capture(snapshots[row], ids, h, count, capture[row], state.script_rec.device)
            if ids.numel() == 1:
                h = TokenHash.step(h, int(ids.item()))
            else:
                h = self.script.hasher.extend(h, ids.cpu().numpy())
            _write(state, h, count + ids.numel())
            if self.inner is None:
                state.num_tokens += ids.numel()
            token = self.script.next_token(h)
            logits[row, self.config.eos_token_id if token is None else token] = 1.0
        return logits, snapshots

    def _capture(self, snaps: dict, ids: torch.Tensor, h: int, count: int,
                 positions: tuple[int, ...], device: torch.device) -> None:
        """Add the script state at each captured position to ``snaps`` (after the inner
        model's tensors, when there is an inner model)."""
        arr = ids.cpu().numpy()
        for p in positions:
            if not count < p <= count + arr.shape[0]:
                continue
            hp = self.script.hasher.extend(h, arr[: p - count])
            rec = torch.tensor([_signed(hp), p], dtype=torch.int64, device=device)
            snaps[p] = list(snaps.get(p, ())) + [rec]

    def _logits(self, rows: int, vocab: int, device: torch.device) -> torch.Tensor:
        """A zeroed ``[rows, vocab]`` fp32 buffer (reused between steps: the engine reads a
        step's logits before the next step)."""
        buf = self._buffer
        if buf is None or buf.shape[0] < rows or buf.shape[1] != vocab or buf.device != device:
            buf = self._buffer = torch.zeros(max(rows, 8), vocab, dtype=torch.float32,
                                             device=device)
        else:
            buf[:rows].zero_()
        return buf[:rows]

    def forward(self, input_ids: torch.Tensor, state: SequenceState,
                all_logits: bool = False) -> torch.Tensor:
        """One sequence: ``[1, V]`` logits of its last position.

        Raises:
            ValueError: ``all_logits`` (per-position logits are not scripted).
        """
        if all_logits:
            raise ValueError("ScriptedLM scripts only the last position's logits")
        return self.forward_batch([input_ids], [state])
