"""The ``glm4_moe`` family of ``convert_gguf.py``: GLM-4.5 / 4.6 / 4.7 and the Air variants
(``Glm4MoeForCausalLM``) -> llama.cpp arch ``glm4moe``.

Read from llama.cpp ``src/models/glm4-moe.cpp`` (``load_arch_hparams``, ``load_arch_tensors``,
the graph) and ``build_moe_ffn`` in ``src/llama-graph.cpp``. ``config.json`` is flat. The
embeddings, ``model.norm``, ``lm_head`` and every layer's input_layernorm, q/k/v/o weights map
as for qwen3_moe (``convert_gguf.py``); the rest, per layer i (Ld = first_k_dense_replace dense
SwiGLU layers first, then MoE layers of E routed experts of width I plus S shared ones):

======================================================  ===========================  ==============
HF tensor (PyTorch shape), under ``model.layers.i.``    GGUF tensor                  ggml ne
======================================================  ===========================  ==============
self_attn.{q,k,v}_proj.bias [n*D] (attention_bias)      blk.i.attn_{q,k,v}.bias      {n*D}
self_attn.{q,k}_norm.weight [D]   (use_qk_norm)         blk.i.attn_{q,k}_norm        {D}
post_attention_layernorm.weight [H]                     blk.i.post_attention_norm    {H}
i < Ld: mlp.{gate,up}_proj.weight [F, H]                blk.i.ffn_{gate,up}.weight   {H, F}
i < Ld: mlp.down_proj.weight [H, F]                     blk.i.ffn_down.weight        {F, H}
mlp.gate.weight [E, H] (router, f32)                    blk.i.ffn_gate_inp.weight    {H, E}
mlp.gate.e_score_correction_bias [E] (f32)              blk.i.exp_probs_b.bias       {E}
mlp.experts.e.{gate,up}_proj.weight [I, H]              blk.i.ffn_{gate,up}_exps     {H, I, E}
mlp.experts.e.down_proj.weight [H, I]                   blk.i.ffn_down_exps          {I, H, E}
mlp.shared_experts.{gate,up}_proj.weight [S*I, H]       blk.i.ffn_{gate,up}_shexp    {H, S*I}
mlp.shared_experts.down_proj.weight [H, S*I]            blk.i.ffn_down_shexp         {S*I, H}
======================================================  ===========================  ==============

Every tensor is copied: the norms are plain ``w * rms(x)`` in both models (q/k norms per head,
after the biases, before RoPE, as llama.cpp's graph applies them), and the HF model's RoPE is NEOX
(rotate-half) on the first rope.dimension_count = int(D * partial_rotary_factor) dims of each
head (partial_rotary_factor defaults to 0.5, as in transformers), which is llama.cpp's glm4moe
rope without M-RoPE sections. The shared experts are ungated and added to the routed output.

Routing: llama.cpp's ``build_moe_ffn`` with expert_gating_func = sigmoid, ``exp_probs_b`` and
(when written) the expert groups is transformers' ``Glm4MoeTopkRouter``: scores = sigmoid(router
logits); experts are chosen by scores + e_score_correction_bias among the expert_group_used_count
groups (of expert_group_count) whose two best biased scores sum highest (the others masked to
-inf); their weights are the unbiased scores, divided by their sum when expert_weights_norm
(``norm_topk_prob``; transformers adds 1e-20 to the sum, llama.cpp clamps it at 6.1e-5), times
expert_weights_scale (``routed_scaling_factor``). llama.cpp asserts expert_group_used_count <
expert_group_count, so with topk_group == n_group (no group is ever masked; GLM-4.5's n_group 1)
no group key is written.

Hyper-parameters beyond the common ones (block_count, context/embedding/feed_forward_length,
head counts, key/value_length, rope.freq_base, rms epsilon): rope.dimension_count, expert_count
(``n_routed_experts``), expert_used_count, expert_feed_forward_length (I), expert_shared_count
(S), leading_dense_block_count (Ld), expert_gating_func (sigmoid), expert_weights_norm,
expert_weights_scale and, for group-limited routing, expert_group_count / used_count (``n_group``
/ ``topk_group``). The tokenizer's ``<|user|>`` and ``<|observation|>`` (GLM's turn ends, in the
config's ``eos_token_id`` list) become the eot / eom ids, which llama.cpp adds to its
end-of-generation set next to eos ``<|endoftext|>`` (logging that they were not found by text).

The multi-token-prediction layers (``model.layers.L .. L + num_nextn_predict_layers - 1`` for
L = num_hidden_layers) are left out and nextn_predict_layers is not written: block_count is L and
llama.cpp's loader then expects no ``nextn`` tensors (it decodes without the MTP head). Refused:
hidden_act other than silu, ``n_shared_experts`` < 1 (the graph always adds the shared expert),
dense layers without ``intermediate_size``, and group settings transformers cannot route
(topk_group outside 1..n_group, experts not divisible into groups of at least two).
"""

from __future__ import annotations

import gguf  # pinned gguf==0.19.0 in the peer venv

from gguf_plan import ConversionError, Planned, T, one, stacked

ARCH = gguf.MODEL_ARCH.GLM4_MOE
_QKV = {"q_proj": T.ATTN_Q, "k_proj": T.ATTN_K, "v_proj": T.ATTN_V}
_FFN = {  # HF projection -> (dense FFN, routed experts, shared experts) tensor kinds
    "gate_proj": (T.FFN_GATE, T.FFN_GATE_EXP, T.FFN_GATE_SHEXP),
    "up_proj": (T.FFN_UP, T.FFN_UP_EXP, T.FFN_UP_SHEXP),
    "down_proj": (T.FFN_DOWN, T.FFN_DOWN_EXP, T.FFN_DOWN_SHEXP),
}
TURN_ENDS = {"eot": "<|user|>", "eom": "<|observation|>"}


def skipped_prefixes(config: dict) -> tuple[str, ...]:
    """HF name prefixes of the MTP layers, which are not converted."""
    layers = config["num_hidden_layers"]
    return tuple(f"model.layers.{layers + j}."
                 for j in range(config.get("num_nextn_predict_layers", 0)))


def dense_layers(config: dict) -> int:
    """Leading dense layers: ``first_k_dense_replace`` (default 1), at most every layer."""
    return min(config.get("first_k_dense_replace", 1), config["num_hidden_layers"])


def expert_groups(config: dict) -> tuple[int, int] | None:
    """(``n_group``, ``topk_group``) when routing is group-limited, None when every group is kept.

    Raises:
        ConversionError: settings transformers' router cannot run.
    """
    n, k = config.get("n_group", 1), config.get("topk_group", 1)
    experts = config["n_routed_experts"]
    if not 1 <= k <= n:
        raise ConversionError(f"topk_group {k} is not in 1..n_group ({n})")
    if k == n:
        return None
    if experts % n or experts // n < 2:
        raise ConversionError(f"n_routed_experts {experts} does not split into n_group {n} "
                              "groups of at least two experts")
    return n, k


def check(config: dict) -> None:
    """Refuse what llama.cpp's glm4moe cannot run as the HF model does (module docstring)."""
    if config.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"hidden_act {config['hidden_act']!r}: llama.cpp's glm4moe is silu")
    if config.get("n_shared_experts", 1) < 1:
        raise ConversionError("n_shared_experts < 1: llama.cpp's glm4moe always adds the shared "
                              "expert")
    if dense_layers(config) and "intermediate_size" not in config:
        raise ConversionError("dense layers (first_k_dense_replace) without intermediate_size")
    expert_groups(config)


def plan(config: dict, shapes: dict) -> list[Planned]:
    """The per-layer GGUF tensors (the global ones are planned by ``convert_gguf.py``)."""
    out, experts = [], config["n_routed_experts"]
    for i in range(config["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        att, mlp = pre + "self_attn.", pre + "mlp."
        out.append(one(shapes, pre + "input_layernorm.weight", T.ATTN_NORM, i))
        for proj, kind in _QKV.items():
            out.append(one(shapes, f"{att}{proj}.weight", kind, i))
            if config.get("attention_bias", False):
                out.append(one(shapes, f"{att}{proj}.bias", kind, i, suffix=".bias"))
        out.append(one(shapes, att + "o_proj.weight", T.ATTN_OUT, i))
        if config.get("use_qk_norm", False):
            out += [one(shapes, att + "q_norm.weight", T.ATTN_Q_NORM, i),
                    one(shapes, att + "k_norm.weight", T.ATTN_K_NORM, i)]
        out.append(one(shapes, pre + "post_attention_layernorm.weight", T.ATTN_POST_NORM, i))
        if i < dense_layers(config):
            out += [one(shapes, f"{mlp}{p}.weight", kinds[0], i) for p, kinds in _FFN.items()]
            continue
        out += [one(shapes, mlp + "gate.weight", T.FFN_GATE_INP, i),
                one(shapes, mlp + "gate.e_score_correction_bias", T.FFN_EXP_PROBS_B, i)]
        out += [stacked(shapes, [f"{mlp}experts.{e}.{p}.weight" for e in range(experts)],
                        kinds[1], i) for p, kinds in _FFN.items()]
        out += [one(shapes, f"{mlp}shared_experts.{p}.weight", kinds[2], i)
                for p, kinds in _FFN.items()]
    return out


def add_hparams(w: gguf.GGUFWriter, config: dict, head_dim: int, partial: float) -> None:
    """The rope and MoE keys llama.cpp's glm4moe loader reads (module docstring)."""
    w.add_rope_dimension_count(int(head_dim * partial))
    w.add_expert_count(config["n_routed_experts"])
    w.add_expert_used_count(config["num_experts_per_tok"])
    w.add_expert_feed_forward_length(config["moe_intermediate_size"])
    w.add_expert_shared_count(config.get("n_shared_experts", 1))
    w.add_leading_dense_block_count(dense_layers(config))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_norm(bool(config.get("norm_topk_prob", True)))
    w.add_expert_weights_scale(float(config.get("routed_scaling_factor", 1.0)))
    if (groups := expert_groups(config)) is not None:
        w.add_expert_group_count(groups[0])
        w.add_expert_group_used_count(groups[1])


def add_turn_ends(w: gguf.GGUFWriter, tokens: list[str]) -> None:
    """eot / eom ids of GLM's turn-end tokens (:data:`TURN_ENDS`) that the vocabulary has."""
    ids = {text: i for i, text in enumerate(tokens)}
    if (eot := ids.get(TURN_ENDS["eot"])) is not None:
        w.add_eot_token_id(eot)
    if (eom := ids.get(TURN_ENDS["eom"])) is not None:
        w.add_eom_token_id(eom)
