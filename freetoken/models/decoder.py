"""The decoder-only causal LM shared by the Qwen3 families, run against a per-sequence state.

Source: transformers ``Qwen3MoeModel`` / ``Qwen3NextModel`` + ``*ForCausalLM``: embedding, pre-norm
blocks ``h += mixer(norm_in(h)); h += mlp(norm_post(h))``, final norm, ``lm_head``. A family
subclass only says which mixer / MLP each layer gets. Long inputs run in chunks of
``prefill_chunk`` tokens (attention sees a ``[chunk, cached + chunk]`` mask, never
``[T, T]``), and without ``all_logits`` only the last position goes through ``lm_head``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from freetoken.models.attention import Attention, AttnContext
from freetoken.models.base import CausalLM
from freetoken.models.config import ModelConfig
from freetoken.models.gated_deltanet import GatedDeltaNet
from freetoken.models.loader import WeightTarget
from freetoken.models.moe import DenseMLP, SparseMoE
from freetoken.models.norms import RMSNorm
from freetoken.models.rotary import RotaryTable
from freetoken.models.state import HybridState, KVCache

ExpertsFactory = Callable[[int, int], nn.Module]
DEFAULT_PREFILL_CHUNK = 1024
# On small machines a one-token step is dozens of tiny kernels; splitting each over 2 OpenMP
# threads costs more in synchronisation than it gains, and when another process holds a core it
# stalls every parallel region (measured on the 2-core dev machine, tiny qwen3_next: ~9 ms/token
# on 1 thread vs 20-90 ms with 2 threads under load).
DEFAULT_DECODE_THREADS = 1 if (os.cpu_count() or 1) <= 4 else None


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
        decode_threads: intra-op threads used while consuming a single token (restored after);
            None keeps torch's setting. Defaults to 1 on machines with <= 4 CPUs.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32,
                 device=None, experts_factory: ExpertsFactory | None = None) -> None:
        super().__init__()
        self.moe_runtime = None  # set by the offload loader (``freetoken.offload.loading``)
        self.config = config
        self.dtype = dtype
        self.prefill_chunk = DEFAULT_PREFILL_CHUNK
        self.decode_threads = DEFAULT_DECODE_THREADS
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
                mlp = SparseMoE(config, i, dtype, device, moe_layer, experts)
                moe_layer += 1
            else:
                mlp = DenseMLP(h, config.intermediate_size, dtype, device)
            layers.append(DecoderLayer(self.build_mixer(i, dtype, device), mlp,
                                       RMSNorm(h, eps, zc, device), RMSNorm(h, eps, zc, device)))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(h, eps, zc, device)
        self.rotary = RotaryTable(config.rotary_dim, config.rope_theta, device)

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

    def _check_input(self, input_ids: torch.Tensor, state: HybridState) -> None:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1 or not input_ids.numel():
            raise ValueError("input_ids must be a non-empty 1-D tensor of token ids")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be int64, got {input_ids.dtype}")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} out of range [0, {self.config.vocab_size})")
        end = state.num_tokens + input_ids.numel()
        if end > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {end} tokens exceeds max_position_embeddings "
                f"{self.config.max_position_embeddings}"
            )

    def _run_chunk(self, ids: torch.Tensor, state: HybridState) -> torch.Tensor:
        start, t = state.num_tokens, ids.shape[0]
        h = F.embedding(ids, self.embed)
        ctx = AttnContext.build(start, t, self.rotary, self.dtype)
        for layer, layer_state in zip(self.layers, state.layers):
            h = layer(h, layer_state, ctx)
        state.num_tokens = start + t
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
        """
        self._check_input(input_ids, state)
        threads = torch.get_num_threads()
        if input_ids.numel() == 1 and self.decode_threads and self.decode_threads != threads:
            torch.set_num_threads(self.decode_threads)
            try:
                return self._forward(input_ids, state, all_logits)
            finally:
                torch.set_num_threads(threads)
        return self._forward(input_ids, state, all_logits)

    def _forward(self, input_ids: torch.Tensor, state: HybridState,
                 all_logits: bool) -> torch.Tensor:
        ids = input_ids.to(device=self.embed.device, dtype=torch.int64)
        outputs = []
        with torch.inference_mode():
            for s in range(0, ids.shape[0], self.prefill_chunk):
                h = self._run_chunk(ids[s : s + self.prefill_chunk], state)
                if all_logits:
                    outputs.append(F.linear(self.norm(h), self.lm_head).float())
            if not all_logits:
                outputs.append(F.linear(self.norm(h[-1:]), self.lm_head).float())
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)
