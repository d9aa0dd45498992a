"""The decoder-only causal LM shared by the Qwen3 families, run against a per-sequence state.

Source: transformers ``Qwen3MoeModel`` / ``Qwen3NextModel`` + ``*ForCausalLM``: embedding, pre-norm
blocks ``h += mixer(norm_in(h)); h += mlp(norm_post(h))``, final norm, ``lm_head``. A family
subclass only says which mixer / MLP each layer gets. Long inputs run in chunks of
``prefill_chunk`` tokens (attention sees a ``[chunk, cached + chunk]`` mask, never
``[T, T]``), and without ``all_logits`` only the last position goes through ``lm_head``.

:meth:`DecoderLM.forward_batch` runs several sequences in one step (prefill chunks and decode
tokens mixed, as in continuous batching, Orca OSDI 2022): embedding, norms, MLP / MoE and
``lm_head`` see all tokens at once, the attention / Gated DeltaNet mixers run per sequence on
its slice against its own state. States may keep K/V in a shared page pool
(:meth:`DecoderLM.new_paged_state`, ``freetoken.models.paged``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from freetoken.models.attention import Attention, AttnContext
from freetoken.models.base import CausalLM, check_batch
from freetoken.models.config import ModelConfig
from freetoken.models.decode_stack import (build_decode_stack, copied_parameters,
                                           run_decode_stack)
from freetoken.models.gated_deltanet import GatedDeltaNet
from freetoken.models.loader import WeightTarget
from freetoken.models.moe import DenseMLP, SparseMoE
from freetoken.models.norms import RMSNorm
from freetoken.models.paged import PagedDecodeBatch, PagedKV, SlotTable
from freetoken.models.rotary import RotaryTable
from freetoken.models.state import GDNState, HybridState, KVCache
from freetoken.ops.linear import linear

ExpertsFactory = Callable[[int, int], nn.Module]
DEFAULT_PREFILL_CHUNK = 1024
# On small machines a one-token step is dozens of tiny kernels; splitting each over 2 OpenMP
# threads costs more in synchronisation than it gains, and when another process holds a core it
# stalls every parallel region (measured on the 2-core dev machine, tiny qwen3_next: ~9 ms/token
# on 1 thread vs 20-90 ms with 2 threads under load).
DEFAULT_DECODE_THREADS = 1 if (os.cpu_count() or 1) <= 4 else None


_SHORT_IDS = 4096  # inputs up to this many ids are range-checked in Python


def _id_range(ids: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` of a 1-D id tensor: a short one (a decode step's single id) through one
    ``tolist`` rather than two reductions."""
    if ids.numel() <= _SHORT_IDS:
        values = ids.tolist()
        return min(values), max(values)
    lo, hi = torch.aminmax(ids)
    return int(lo), int(hi)


@dataclass(frozen=True)
class DecodePlan:
    """The layer structure a decode step walks.

    Attributes:
        attention: indices of the full-attention layers, in order.
        moe_rows: each MoE block with its layer index (its row of the step's top-k ids).
    """

    attention: tuple[int, ...]
    moe_rows: tuple[tuple[SparseMoE, int], ...]


class DecoderLayer(nn.Module):
    """One pre-norm block: a token mixer (attention or GDN) and an MLP (MoE or dense)."""

    def __init__(self, mixer: nn.Module, mlp: nn.Module, input_norm: RMSNorm,
                 post_norm: RMSNorm) -> None:
        super().__init__()
        self.mixer, self.mlp = mixer, mlp
        self.input_norm, self.post_norm = input_norm, post_norm

    def forward(self, h: torch.Tensor, layer_state: object, ctx: AttnContext) -> torch.Tensor:
        """``[T, H]`` -> ``[T, H]``; updates ``layer_state`` (KV cache or GDN state)."""
        h = h + self.mixer(self.input_norm(h), layer_state, ctx)
        return h + self.mlp(self.post_norm(h))

    def forward_batch(self, h: torch.Tensor, bounds: list[int], layer_states: list,
                      ctxs: list[AttnContext],
                      paged_decode: PagedDecodeBatch | None = None) -> torch.Tensor:
        """Several sequences: ``h [sum T_i, H]`` holds sequence ``i`` at rows
        ``bounds[i]:bounds[i+1]``; its mixer runs on that slice with ``layer_states[i]`` and
        ``ctxs[i]``, the norms and the MLP / MoE run on all rows at once. With ``paged_decode``
        (one token per sequence, paged KV) an attention mixer runs all rows in one call, its
        input norm and residual add included (:meth:`Attention.forward_paged_decode`), so does a
        Gated DeltaNet mixer unless a
        recurrent-state snapshot is due (:meth:`GatedDeltaNet.forward_decode`), and so does a MoE
        block with resident experts, its norm and residual included
        (:meth:`SparseMoE.forward_residual`). Returns ``[sum T_i, H]``.
        """
        fused = paged_decode is not None
        if fused and isinstance(self.mixer, Attention):
            h = self.mixer.forward_paged_decode(h, self.input_norm, layer_states, paged_decode)
        elif (fused and isinstance(self.mixer, GatedDeltaNet) and self.mixer.decode_fits(h)
              and not any(ctx.capture for ctx in ctxs)):
            h = self.mixer.forward_decode(h, self.input_norm, layer_states)
        else:
            x = self.input_norm(h)
            parts = [self.mixer(x[a:b], st, ctx)
                     for a, b, st, ctx in zip(bounds[:-1], bounds[1:], layer_states, ctxs)]
            h = h + (parts[0] if len(parts) == 1 else torch.cat(parts))
        if fused and isinstance(self.mlp, (SparseMoE, DenseMLP)) and self.mlp.fused_fits(h):
            return self.mlp.forward_residual(h, self.post_norm)
        return h + self.mlp(self.post_norm(h))


class DecoderLM(CausalLM):
    """Embedding + decoder layers + final norm + lm_head over a :class:`HybridState`.

    Subclasses implement :meth:`build_mixer`. With ``tie_word_embeddings`` the lm_head is the
    embedding matrix (no ``lm_head.weight`` tensor is loaded).

    Args:
        config: parsed config.
        dtype: compute/parameter dtype (fp32 or bf16); GDN state and norms stay fp32.
        device: parameter device.
        experts_factory: ``(decoder layer, MoE layer ordinal) -> routed-expert module`` for each
            MoE layer (see :class:`SparseMoE`); None keeps resident expert parameters.

    Attributes:
        moe_runtime: the offload runtime serving the routed experts, or None (resident).
        prefill_chunk: tokens per internal prefill chunk (bounds attention memory).
        paged_decode: let a decode step over paged states run each attention and Gated DeltaNet
            layer, and each MoE block with resident experts, for all sequences in one C++ call
            (:meth:`_paged_decode_batch`); False keeps the per-sequence torch path (tests
            compare the two).
        decode_stack: with ``paged_decode``, run a whole decode step (embedding to logits) as
            one C++ call when every layer fits (:mod:`freetoken.models.decode_stack`), built on
            the first such step (:meth:`reset_decode_stack` after replacing weights); False
            keeps one call per layer (tests compare the two).
        decode_threads: intra-op threads used while consuming a single token (restored after);
            None keeps torch's setting. Defaults to 1 on machines with <= 4 CPUs.
    """

    moe_class: type[SparseMoE] = SparseMoE  # the MoE block of every MoE layer

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32,
                 device=None, experts_factory: ExpertsFactory | None = None) -> None:
        super().__init__()
        self.moe_runtime = None  # set by the offload loader (``freetoken.offload.loading``)
        self.config = config
        self.dtype = dtype
        self.prefill_chunk = DEFAULT_PREFILL_CHUNK
        self.decode_threads = DEFAULT_DECODE_THREADS
        self.paged_decode = True
        self.decode_stack = True
        self._decode_stack = None  # (stack or None, norm weights, their versions) once built
        h, v = config.hidden_size, config.vocab_size
        self.embed = nn.Parameter(torch.empty(v, h, dtype=dtype, device=device),
                                  requires_grad=False)
        self.lm_head = self.embed
        if not config.tie_word_embeddings:
            self.lm_head = nn.Parameter(torch.empty(v, h, dtype=dtype, device=device),
                                        requires_grad=False)
        eps, zc = config.rms_norm_eps, config.zero_centered_norms
        layers = []
        moe_layer = 0
        for i in range(config.num_hidden_layers):
            if config.is_moe_layer(i):
                experts = experts_factory(i, moe_layer) if experts_factory else None
                mlp = self.moe_class(config, i, dtype, device, moe_layer, experts)
                moe_layer += 1
            else:
                mlp = DenseMLP(h, config.intermediate_size, dtype, device)
            layers.append(DecoderLayer(self.build_mixer(i, dtype, device), mlp,
                                       RMSNorm(h, eps, zc, device), RMSNorm(h, eps, zc, device)))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(h, eps, zc, device)
        self.rotary = RotaryTable(config.rotary_dim, config.rope_theta, device, config.yarn)

    def build_mixer(self, layer: int, dtype: torch.dtype, device) -> nn.Module:
        """The token mixer of ``layer`` (an :class:`Attention` or a :class:`GatedDeltaNet`)."""
        raise NotImplementedError

    def mixer_prefix(self, layer: int) -> str:
        """HF sub-module name of the mixer of ``layer`` (``self_attn`` or ``linear_attn``)."""
        return "self_attn" if isinstance(self.layers[layer].mixer, Attention) else "linear_attn"

    def weight_targets(self) -> dict[str, WeightTarget]:
        """Every HF tensor name this model loads -> its destination (``loader.WeightTarget``)."""
        targets = {"model.embed_tokens.weight": WeightTarget(self.embed)}
        if not self.config.tie_word_embeddings:
            targets["lm_head.weight"] = WeightTarget(self.lm_head)
        targets.update(self.norm.weight_targets("model.norm.weight"))
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            targets.update(layer.input_norm.weight_targets(p + "input_layernorm.weight"))
            targets.update(layer.post_norm.weight_targets(p + "post_attention_layernorm.weight"))
            targets.update(layer.mixer.weight_targets(p + self.mixer_prefix(i) + "."))
            targets.update(layer.mlp.weight_targets(p + "mlp."))
        return targets

    def moe_blocks(self) -> list[SparseMoE]:
        """The MoE blocks in layer order (their ``moe_layer`` ordinals are 0, 1, ...)."""
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, SparseMoE)]

    def set_routing_observer(self, observer) -> None:
        """Install (or with None remove) ``observer(moe_layer, topk_ids [T, k])`` on every MoE block."""
        for block in self.moe_blocks():
            block.routing_observer = observer

    def new_state(self) -> HybridState:
        """Empty state: an empty KV cache per attention layer, zero GDN states."""
        c = self.config
        caches: list = []
        for layer in self.layers:
            if isinstance(layer.mixer, GatedDeltaNet):
                caches.append(layer.mixer.new_state())
            else:
                caches.append(KVCache(c.num_key_value_heads, c.head_dim, self.dtype,
                                      self.embed.device))
        return HybridState(caches)

    def reset_decode_stack(self) -> None:
        """Drop the whole-step decode stack; the next decode step builds it from the current
        parameters."""
        self._decode_stack = None

    def _stack_step(self, inputs: list[torch.Tensor], states: list[HybridState],
                    capture) -> torch.Tensor | None:
        """Logits of a decode step run as one C++ call, or None (nothing changed) when the step
        or the model does not fit it or a recurrent-state snapshot is due."""
        if not (self.paged_decode and self.decode_stack) or any(i.shape[0] != 1 for i in inputs):
            return None
        if capture is not None and any(s.num_tokens + 1 in want
                                       for s, want in zip(states, capture[0])):
            return None
        built = self._decode_stack
        if built is None or tuple(w._version for w in built[1]) != built[2]:
            # the stack holds copies of the norms' multipliers and of the biases it takes in
            # fp32: rebuilt when one of them changed in place (every other weight it reads
            # where it lies)
            copied = copied_parameters(self)
            built = self._decode_stack = (build_decode_stack(self), copied,
                                          tuple(w._version for w in copied))
        stack = built[0]
        if stack is None:
            return None
        ids = (torch.cat(inputs) if len(inputs) > 1 else inputs[0]).to(torch.int64)
        return run_decode_stack(self, stack, ids, states)

    def _attention_layers(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if not isinstance(layer.mixer,
                                                                        GatedDeltaNet)]

    def decode_plan(self) -> DecodePlan:
        """What each decode step needs to know of the layer structure (built once: the model's
        layers never change kind after construction)."""
        plan = self.__dict__.get("_decode_plan")
        if plan is None:
            moe_rows = [i for i, layer in enumerate(self.layers)
                        if isinstance(layer.mlp, SparseMoE)]
            plan = self.__dict__["_decode_plan"] = DecodePlan(
                tuple(self._attention_layers()), tuple(zip(self.moe_blocks(), moe_rows)))
        return plan

    def kv_layout(self):
        """Per-token K/V shape of the full-attention layers, for a ``KVPagePool``.

        Returns:
            ``freetoken.prefix.kv_pool.KVLayout`` (num_layers = attention layers, the config's
            ``num_key_value_heads`` / ``head_dim``, the model dtype), or None when every layer is
            a Gated DeltaNet layer.
        """
        from freetoken.prefix.kv_pool import KVLayout

        n = len(self._attention_layers())
        if not n:
            return None
        c = self.config
        return KVLayout(num_layers=n, num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                        dtype=self.dtype)

    def recurrent_layout(self):
        """Shapes/dtypes of :meth:`recurrent_tensors` (a recurrent-state checkpoint).

        Returns:
            ``freetoken.prefix.checkpoints.RecurrentLayout`` with, per GDN layer in order, the
            conv state ``([conv_dim, K-1], model dtype)`` and the recurrent state
            ``([Hv, dk, dv], float32)``; empty ``shapes`` when the model has no GDN layer.
        """
        from freetoken.prefix.checkpoints import RecurrentLayout

        shapes = []
        for layer in self.layers:
            m = layer.mixer
            if isinstance(m, GatedDeltaNet):
                shapes.append(((m.conv_dim, m.kernel - 1), self.dtype))
                shapes.append(((m.hv, m.dk, m.dv), torch.float32))
        return RecurrentLayout(shapes=tuple(shapes))

    def new_paged_state(self, pool, table: SlotTable, num_tokens: int = 0) -> HybridState:
        """A state whose attention layers keep K/V in ``pool`` at ``table``'s token slots.

        Args:
            pool: ``freetoken.prefix.kv_pool.KVPagePool`` built with :meth:`kv_layout` (ignored
                when the model has no attention layer).
            table: the sequence's slot table, shared by all its attention layers; the caller
                extends it before each forward so it covers every position.
            num_tokens: positions already in the pool at ``table.slots[:num_tokens]`` (a reused
                prefix). GDN layers start from zero states: copy a checkpoint taken at
                ``num_tokens`` into :meth:`recurrent_tensors` before the next forward.

        Returns:
            a :class:`HybridState` with ``num_tokens`` set and a :class:`PagedKV` of length
            ``num_tokens`` per attention layer (attention layer ``j`` = pool layer ``j``).

        Raises:
            ValueError: the pool's layout differs from :meth:`kv_layout`, the table is on
                another device than the pool, ``num_tokens`` is negative or above
                ``max_position_embeddings``, or the table holds fewer than ``num_tokens`` slots.
        """
        layout = self.kv_layout()
        if layout is not None and pool.layout != layout:
            raise ValueError(f"pool layout {pool.layout} does not match the model's {layout}")
        if not 0 <= num_tokens <= self.config.max_position_embeddings:
            raise ValueError(f"num_tokens {num_tokens} outside [0, "
                             f"{self.config.max_position_embeddings}]")
        if layout is not None and table.slots.device != pool.k.device:
            raise ValueError(f"slot table on {table.slots.device} but the pool on "
                             f"{pool.k.device}")
        if table.length < num_tokens:
            raise ValueError(f"slot table has {table.length} token slots, fewer than the "
                             f"{num_tokens} restored tokens")
        layers: list = []
        for layer in self.layers:
            if isinstance(layer.mixer, GatedDeltaNet):
                layers.append(layer.mixer.new_state())
            else:
                layers.append(PagedKV(pool, sum(isinstance(x, PagedKV) for x in layers), table,
                                      num_tokens))
        state = HybridState(layers)
        state.num_tokens = num_tokens
        return state

    def recurrent_tensors(self, state: HybridState) -> list[torch.Tensor]:
        """Live GDN state tensors ``[conv_0, rec_0, conv_1, rec_1, ...]`` in layer order (the
        objects inside ``state``: ``copy_`` into them restores a checkpoint, clone them to take
        one). Shapes/dtypes as :meth:`recurrent_layout`; empty for attention-only models."""
        out = []
        for layer_state in state.layers:
            if isinstance(layer_state, GDNState):
                out += [layer_state.conv, layer_state.recurrent]
        return out

    def _check_input(self, input_ids: torch.Tensor, state: HybridState) -> None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1 or not input_ids.numel():
            raise ValueError("input_ids must be a non-empty 1-D tensor of token ids")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be int64, got {input_ids.dtype}")
        lo, hi = _id_range(input_ids)
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} out of range [0, {self.config.vocab_size})")
        end = state.num_tokens + input_ids.numel()
        if end > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {end} tokens exceeds max_position_embeddings "
                f"{self.config.max_position_embeddings}"
            )
        for layer_state in state.layers:
            if isinstance(layer_state, PagedKV):
                layer_state.check_room(input_ids.numel())

    def _run_chunk(self, ids: torch.Tensor, state: HybridState,
                   snapshots: dict[int, list[torch.Tensor]] | None = None,
                   capture: tuple[int, ...] = ()) -> torch.Tensor:
        start, t = state.num_tokens, ids.shape[0]
        h = F.embedding(ids, self.embed)
        offsets = tuple(p - start for p in capture if start < p <= start + t)
        ctx = AttnContext.build(start, t, self.rotary, self.dtype, offsets)
        for layer, layer_state in zip(self.layers, state.layers):
            h = layer(h, layer_state, ctx)
        state.num_tokens = start + t
        if snapshots is not None:
            snapshots.update({start + o: snap for o, snap in ctx.snapshots.items()})
        return h

    def forward(self, input_ids: torch.Tensor, state: HybridState,
                all_logits: bool = False) -> torch.Tensor:
        """Consume ``input_ids`` after ``state.num_tokens`` earlier tokens.

        Args:
            input_ids: ``[T]`` int64 token ids in ``[0, vocab_size)``, T >= 1.
            state: from :meth:`new_state`; updated in place (``num_tokens`` grows by T).
            all_logits: return logits of every position instead of only the last.

        Returns:
            ``[T, V]`` (``all_logits``) or ``[1, V]`` float32 logits.

        Raises:
            ValueError: empty / non-1-D / non-integer input, an id outside the vocabulary, or
                ``num_tokens + T`` above ``max_position_embeddings`` (state left unchanged).
            RuntimeError: a paged state's slot table has fewer than ``num_tokens + T`` slots
                (state left unchanged).
        """
        self._check_input(input_ids, state)
        return self._threaded(input_ids.numel() == 1, self._forward, input_ids, state,
                              all_logits)

    def _threaded(self, decode: bool, fn, *args):
        """``fn(*args)`` under ``decode_threads`` intra-op threads when ``decode`` (restored)."""
        threads = torch.get_num_threads()
        if decode and self.decode_threads and self.decode_threads != threads:
            torch.set_num_threads(self.decode_threads)
            try:
                return fn(*args)
            finally:
                torch.set_num_threads(threads)
        return fn(*args)

    def _forward(self, input_ids: torch.Tensor, state: HybridState,
                 all_logits: bool) -> torch.Tensor:
        ids = input_ids.to(device=self.embed.device, dtype=torch.int64)
        outputs = []
        with torch.inference_mode():
            for s in range(0, ids.shape[0], self.prefill_chunk):
                h = self._run_chunk(ids[s : s + self.prefill_chunk], state)
                if all_logits:
                    outputs.append(linear(self.norm(h), self.lm_head).float())
            if not all_logits:
                outputs.append(linear(self.norm(h[-1:]), self.lm_head).float())
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def forward_batch(self, inputs: list[torch.Tensor],
                      states: list[HybridState], _capture=None) -> torch.Tensor:
        """One step over ``B`` sequences: prefill chunks and decode tokens mixed.

        Embedding, norms, MLP / MoE (the offload runtime sees ``[sum T_i, H]``) and ``lm_head``
        run on all tokens at once; each attention / GDN mixer runs per sequence on its slice with
        its own positions (``AttnContext`` at that state's ``num_tokens``) and layer state.
        A sequence with more than ``prefill_chunk`` tokens first consumes its leading full
        chunks alone (exactly the chunk boundaries :meth:`forward` uses), and only its last
        chunk (1..``prefill_chunk`` tokens) joins the batch, so attention memory stays bounded
        by ``prefill_chunk`` per sequence. When every input is one token the step runs under
        ``decode_threads``. Equals running each sequence alone through :meth:`forward` up to
        float summation order (greedy-identical).

        Args:
            inputs: ``B >= 1`` tensors ``[T_i]`` int64 token ids in ``[0, vocab_size)``.
            states: ``B`` distinct states (from :meth:`new_state` / :meth:`new_paged_state`),
                each updated in place (``num_tokens`` grows by ``T_i``).

        Returns:
            ``[B, V]`` float32 logits of each sequence's last position.

        Raises:
            ValueError: not lists of equal length >= 1, the same state twice, or any input that
                :meth:`forward` rejects (no state is changed).
            RuntimeError: a paged state's slot table is too short (no state is changed).
        """
        check_batch(inputs, states)
        if len({id(s) for s in states}) != len(states):
            raise ValueError("forward_batch got the same state more than once")
        for ids, state in zip(inputs, states):
            self._check_input(ids, state)
        decode = all(ids.numel() == 1 for ids in inputs)
        return self._threaded(decode, self._forward_batch, inputs, states, _capture)

    def forward_batch_capture(self, inputs: list[torch.Tensor], states: list[HybridState],
                              capture: list[tuple[int, ...]]
                              ) -> tuple[torch.Tensor, list[dict[int, list[torch.Tensor]]]]:
        """:meth:`forward_batch` that also snapshots each sequence's recurrent state at the
        absolute positions ``capture[i]`` (``num_tokens < p <= num_tokens + T_i``) inside its
        input, without splitting the forward (Gated DeltaNet layers run their delta rule segment
        by segment; attention and MLP see the whole chunk).

        Returns:
            ``(logits [B, V], snapshots)`` with ``snapshots[i]`` mapping each captured position to
            copies of the state tensors in :meth:`recurrent_tensors` order.

        Raises:
            ValueError: as :meth:`forward_batch`, or ``capture`` not one entry per sequence.
        """
        if not isinstance(capture, (list, tuple)) or len(capture) != len(inputs):
            raise ValueError("forward_batch_capture needs one capture tuple per sequence")
        snapshots: list[dict[int, list[torch.Tensor]]] = [{} for _ in inputs]
        logits = self.forward_batch(inputs, states, _capture=(capture, snapshots))
        return logits, snapshots

    def _paged_decode_batch(self, h: torch.Tensor, tails: list[torch.Tensor],
                            states: list[HybridState]) -> PagedDecodeBatch | None:
        """The step's attention metadata when every sequence adds one token and keeps its K/V
        in one page pool, on a device the C++ decode attention runs on; else None."""
        if not self.paged_decode or any(ids.shape[0] != 1 for ids in tails):
            return None
        attn = self.decode_plan().attention
        if not attn or not self.layers[attn[0]].mixer.paged_decode_fits(h):
            return None
        return PagedDecodeBatch.of_layer([s.layers[attn[0]] for s in states],
                                         [s.num_tokens for s in states], self.rotary)

    def _forward_batch(self, inputs: list[torch.Tensor], states: list[HybridState],
                       capture=None) -> torch.Tensor:
        with torch.inference_mode():
            logits = self._stack_step(inputs, states, capture)
        if logits is not None:
            return logits
        device, chunk = self.embed.device, self.prefill_chunk
        wanted, snapshots = capture if capture is not None else ([()] * len(inputs), None)
        tails = []
        with torch.inference_mode():
            for i, (ids, state) in enumerate(zip(inputs, states)):
                ids = ids.to(device=device, dtype=torch.int64)
                head = (ids.shape[0] - 1) // chunk * chunk  # full leading chunks
                for s in range(0, head, chunk):
                    self._run_chunk(ids[s : s + chunk], state,
                                    None if snapshots is None else snapshots[i], wanted[i])
                tails.append(ids[head:])
            bounds = [0]
            for ids in tails:
                bounds.append(bounds[-1] + ids.shape[0])
            ctxs = [AttnContext.build(state.num_tokens, ids.shape[0], self.rotary, self.dtype,
                                      tuple(p - state.num_tokens for p in want
                                            if state.num_tokens < p <= state.num_tokens
                                            + ids.shape[0]))
                    for ids, state, want in zip(tails, states, wanted)]
            h = F.embedding(torch.cat(tails) if len(tails) > 1 else tails[0], self.embed)
            paged = self._paged_decode_batch(h, tails, states)
            for i, layer in enumerate(self.layers):
                h = layer.forward_batch(h, bounds, [s.layers[i] for s in states], ctxs, paged)
            for i, (ids, state, ctx) in enumerate(zip(tails, states, ctxs)):
                if snapshots is not None:
                    snapshots[i].update({state.num_tokens + o: snap
                                         for o, snap in ctx.snapshots.items()})
                state.num_tokens += ids.shape[0]
            last = torch.tensor(bounds[1:], device=device) - 1
            return linear(self.norm(h.index_select(0, last)), self.lm_head).float()
