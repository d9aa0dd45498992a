"""Convert a FreeToken / Hugging Face ``qwen3_moe`` checkpoint to a GGUF file for llama.cpp.

Usage (run with the peer virtualenv's python, which has numpy + ``gguf==0.19.0``)::

    python evals/peers/convert_gguf.py MODEL_DIR OUT.gguf [--outtype f32|bf16|f16]

Written for FreeToken from llama.cpp's published layout (read, not copied): the architecture
string, tensor names and metadata keys come from the ``gguf`` package at run time
(``gguf.MODEL_ARCH_NAMES``, ``gguf.TENSOR_NAMES``, ``GGUFWriter.add_*``); which tensors and keys
the ``qwen3moe`` graph loads, and in which shape, from llama.cpp ``src/models/qwen3moe.cpp``
(``load_arch_hparams`` / ``load_arch_tensors``):

======================================================  ==========================  ===============
HF tensor (PyTorch shape)                               GGUF tensor                 ggml ne
======================================================  ==========================  ===============
model.embed_tokens.weight [V, H]                        token_embd.weight           {H, V}
model.norm.weight [H]                                   output_norm.weight          {H}
lm_head.weight [V, H] (absent when tied)                output.weight               {H, V}
layers.i.input_layernorm.weight [H]                     blk.i.attn_norm.weight      {H}
layers.i.self_attn.{q,k,v}_proj.weight [n*D, H]         blk.i.attn_{q,k,v}.weight   {H, n*D}
layers.i.self_attn.o_proj.weight [H, nq*D]              blk.i.attn_output.weight    {nq*D, H}
layers.i.self_attn.{q,k}_norm.weight [D]                blk.i.attn_{q,k}_norm       {D}
layers.i.post_attention_layernorm.weight [H]            blk.i.ffn_norm.weight       {H}
layers.i.mlp.gate.weight [E, H] (router)                blk.i.ffn_gate_inp.weight   {H, E}
layers.i.mlp.experts.e.{gate,up}_proj.weight [I, H]     blk.i.ffn_{gate,up}_exps    {H, I, E}
layers.i.mlp.experts.e.down_proj.weight [H, I]          blk.i.ffn_down_exps         {I, H, E}
======================================================  ==========================  ===============

GGUF stores dims reversed from numpy, so an array of numpy shape (E, I, H) has ne {H, I, E}; the
per-expert matrices are stacked on a new leading axis. No Q/K permutation: qwen3moe uses NEOX
(rotate-half) RoPE like the HF model. Hyper-parameters: block_count, context_length,
embedding_length, feed_forward_length, attention.head_count(_kv), attention.key/value_length
(head_dim), rope.freq_base, attention.layer_norm_rms_epsilon, expert_count, expert_used_count,
expert_feed_forward_length. llama.cpp's qwen3moe graph always renormalises the top-k weights
after a softmax, so a config with ``norm_topk_prob: false`` or rope scaling is refused.

dtype: ``f32`` is exact for bf16/f16/f32 checkpoints; ``bf16`` is exact for bf16 checkpoints;
``f16`` rounds. 1-D tensors (norms) and the router stay float32 in every mode (a rounded router
can flip a top-k choice).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gguf  # noqa: E402  (pinned gguf==0.19.0 in the peer venv)

from gguf_vocab import load_vocab  # noqa: E402
from safetensors_np import SafetensorsCheckpoint  # noqa: E402

T = gguf.MODEL_TENSOR
# per-layer dense tensors: HF suffix after "model.layers.{i}." -> gguf tensor kind
_LAYER_TENSORS = {
    "input_layernorm.weight": T.ATTN_NORM,
    "self_attn.q_proj.weight": T.ATTN_Q,
    "self_attn.k_proj.weight": T.ATTN_K,
    "self_attn.v_proj.weight": T.ATTN_V,
    "self_attn.o_proj.weight": T.ATTN_OUT,
    "self_attn.q_norm.weight": T.ATTN_Q_NORM,
    "self_attn.k_norm.weight": T.ATTN_K_NORM,
    "post_attention_layernorm.weight": T.FFN_NORM,
    "mlp.gate.weight": T.FFN_GATE_INP,
}
_EXPERT_TENSORS = {"gate_proj": T.FFN_GATE_EXP, "up_proj": T.FFN_UP_EXP, "down_proj": T.FFN_DOWN_EXP}
_GLOBAL_TENSORS = {"model.embed_tokens.weight": T.TOKEN_EMBD, "model.norm.weight": T.OUTPUT_NORM,
                   "lm_head.weight": T.OUTPUT}
_ALWAYS_F32 = {T.FFN_GATE_INP}
_OUTTYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
}


class ConversionError(ValueError):
    """The checkpoint cannot be expressed as a llama.cpp qwen3moe GGUF (message says why)."""


def _name(kind: gguf.MODEL_TENSOR, bid: int | None = None) -> str:
    fmt = gguf.TENSOR_NAMES[kind]
    return (fmt.format(bid=bid) if bid is not None else fmt) + ".weight"


def plan_tensors(config: dict, ckpt: SafetensorsCheckpoint) -> list[tuple[str, T, list[str]]]:
    """The GGUF tensors in write order: ``(gguf_name, kind, hf_names)``; an expert tensor lists
    its ``num_experts`` HF names in expert order (stacked on axis 0).

    Raises:
        ConversionError: a checkpoint tensor is left unmapped or an expected one is missing.
    """
    layers, n_exp = config["num_hidden_layers"], config["num_experts"]
    plan: list[tuple[str, T, list[str]]] = []
    for hf, kind in _GLOBAL_TENSORS.items():
        if hf == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        plan.append((_name(kind), kind, [hf]))
    for i in range(layers):
        for suffix, kind in _LAYER_TENSORS.items():
            plan.append((_name(kind, i), kind, [f"model.layers.{i}.{suffix}"]))
        for proj, kind in _EXPERT_TENSORS.items():
            names = [f"model.layers.{i}.mlp.experts.{e}.{proj}.weight" for e in range(n_exp)]
            plan.append((_name(kind, i), kind, names))
    wanted = {n for _, _, names in plan for n in names}
    have = set(ckpt.names())
    if missing := sorted(wanted - have):
        raise ConversionError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
    if extra := sorted(have - wanted):
        raise ConversionError(f"{len(extra)} checkpoint tensors have no GGUF mapping: {extra[:3]}")
    allowed = set(gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3MOE])
    if bad := sorted({k.name for _, k, _ in plan} - {k.name for k in allowed}):
        raise ConversionError(f"gguf's qwen3moe tensor list lacks {bad}")
    return plan


def _check_config(config: dict) -> None:
    if config.get("model_type") != "qwen3_moe":
        raise ConversionError(f"model_type {config.get('model_type')!r} is not qwen3_moe "
                              "(only qwen3_moe is mapped)")
    if not config.get("norm_topk_prob", False):
        raise ConversionError("norm_topk_prob=false: llama.cpp's qwen3moe always renormalises top-k")
    if config.get("rope_scaling"):
        raise ConversionError(f"rope_scaling {config['rope_scaling']!r} is not mapped")
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        raise ConversionError("dense (mlp_only) layers are not supported by llama.cpp's qwen3moe")
    if config.get("attention_bias"):
        raise ConversionError("attention_bias=true is not mapped")


def _write_metadata(w: gguf.GGUFWriter, config: dict, model_dir: Path, ftype) -> None:
    w.add_name(model_dir.name)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(config["rope_theta"]))
    w.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    w.add_expert_count(config["num_experts"])
    w.add_expert_used_count(config["num_experts_per_tok"])
    w.add_expert_feed_forward_length(config["moe_intermediate_size"])
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    vocab = load_vocab(model_dir, config["vocab_size"], config.get("bos_token_id"))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    if vocab.pad_id is not None:
        w.add_pad_token_id(vocab.pad_id)
    w.add_add_bos_token(False)
    if vocab.chat_template:
        w.add_chat_template(vocab.chat_template)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)


def _encode(ckpt: SafetensorsCheckpoint, names: list[str], qtype) -> np.ndarray:
    """Stack (if several) and encode the HF tensors ``names`` in GGUF dtype ``qtype``."""
    if qtype == gguf.GGMLQuantizationType.BF16 and all(ckpt.dtype_tag(n) == "BF16" for n in names):
        parts = [np.asarray(ckpt.raw(n)) for n in names]  # exact: keep the stored bits
        return np.ascontiguousarray(np.stack(parts) if len(names) > 1 else parts[0])
    parts = [ckpt.float32(n) for n in names]
    x = np.stack(parts) if len(names) > 1 else parts[0]
    if qtype == gguf.GGMLQuantizationType.F32:
        return np.ascontiguousarray(x)
    if qtype == gguf.GGMLQuantizationType.F16:
        return x.astype(np.float16)
    return _bf16_bits(x)


def convert(model_dir: str | Path, out_path: str | Path, outtype: str = "f32",
            log=print) -> Path:
    """Write ``out_path`` (GGUF, arch ``qwen3moe``) from the checkpoint in ``model_dir``.

    Args:
        model_dir: HF checkpoint directory (config.json, safetensors, tokenizer.json).
        out_path: destination file; written to ``<out>.tmp`` then renamed.
        outtype: ``f32`` (exact), ``bf16`` (exact for bf16 weights) or ``f16``.
        log: progress callback (one line per call).

    Returns:
        the written path.

    Raises:
        ConversionError: unsupported architecture/config, or tensors that do not map 1:1.
        FileNotFoundError: missing config.json / weights / tokenizer.json.
    """
    model_dir, out_path = Path(model_dir), Path(out_path)
    if outtype not in _OUTTYPES:
        raise ConversionError(f"outtype {outtype!r}; expected one of {', '.join(_OUTTYPES)}")
    qtype, ftype = _OUTTYPES[outtype]
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    _check_config(config)
    ckpt = SafetensorsCheckpoint(model_dir)
    plan = plan_tensors(config, ckpt)
    t0 = time.perf_counter()
    tmp = out_path.with_name(out_path.name + ".tmp")
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3MOE]
    w = gguf.GGUFWriter(tmp, arch)
    _write_metadata(w, config, model_dir, ftype)

    dtypes = {}
    for name, kind, hf in plan:
        shape = ckpt.shape(hf[0])
        full = (len(hf), *shape) if len(hf) > 1 else shape
        t = gguf.GGMLQuantizationType.F32 if len(shape) == 1 or kind in _ALWAYS_F32 else qtype
        item = {gguf.GGMLQuantizationType.F32: 4}.get(t, 2)
        np_dtype = {gguf.GGMLQuantizationType.F32: np.float32,
                    gguf.GGMLQuantizationType.F16: np.float16}.get(t, np.uint16)
        raw = None if t != gguf.GGMLQuantizationType.BF16 else t
        w.add_tensor_info(name, full, np.dtype(np_dtype), int(np.prod(full)) * item, raw_dtype=raw)
        dtypes[name] = t
    w.write_header_to_file(tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, _kind, hf in _iter_logged(plan, log):
        w.write_tensor_data(_encode(ckpt, hf, dtypes[name]))
    w.close()
    tmp.replace(out_path)
    log(f"wrote {out_path} ({out_path.stat().st_size / 2**20:.1f} MiB, {len(plan)} tensors, "
        f"{outtype}) in {time.perf_counter() - t0:.1f} s")
    return out_path


def _iter_logged(plan: list, log) -> Iterator:
    step = max(1, len(plan) // 10)
    for n, item in enumerate(plan):
        if n % step == 0:
            log(f"  tensor {n + 1}/{len(plan)}: {item[0]}")
        yield item


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; exit 0 on success, 2 on a conversion error (message on stderr)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--outtype", choices=sorted(_OUTTYPES), default="f32")
    args = p.parse_args(argv)
    try:
        convert(args.model_dir, args.out, args.outtype, log=lambda s: print(s, file=sys.stderr))
    except (ConversionError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
