"""Tokenizer files of the generated checkpoints: one trained 8k byte-level BPE, each family's
added (special) tokens on top of it.

Qwen families: the Qwen3 added tokens of the asset (model-architectures.md §7.2), ChatML end of
turn ``<|im_end|>``. GLM-4.5: its chat tokens (``[gMASK]``, ``<sop>``, ``<|system|>``,
``<|user|>``, ``<|assistant|>``, ``<|observation|>``, the think / tool-call / ``<arg_key>`` /
``<arg_value>`` tags), all special as in the releases (the list and order follow the GLM-4.5
tokenizer as described by harnesses.md; ids are ours, from 8192); a turn ends with
``<|user|>`` or ``<|observation|>``, ``<|endoftext|>`` pads. gpt-oss: the harmony tokens
(model-architectures.md §4.3, ids ours, from 8192, in the order of the release's ids); a final
message ends with ``<|return|>``, a tool call with ``<|call|>``.
"""

from __future__ import annotations

import json

from freetoken.paths import ASSETS_DIR

TOKENIZER_FILE = ASSETS_DIR / "tokenizer" / "tokenizer.json"
_FLAGS = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
GLM_ADDED = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>",
    "<|begin_of_transcription|>", "<|end_of_transcription|>", "<|code_prefix|>",
    "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>",
)

HARMONY_ADDED = (
    "<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
    "<|start|>", "<|end|>", "<|message|>", "<|call|>", "<|endofprompt|>",
)
_FAMILY_ADDED = {"glm4_moe": GLM_ADDED, "gpt_oss": HARMONY_ADDED}


def family_tokenizer(arch: str) -> dict:
    """``tokenizer.json`` contents for ``arch`` (the asset, its added tokens replaced for
    ``glm4_moe`` and ``gpt_oss``)."""
    data = json.loads(TOKENIZER_FILE.read_text(encoding="utf-8"))
    if arch in _FAMILY_ADDED:
        base = len(data["model"]["vocab"])
        data["added_tokens"] = [
            {"id": base + i, "content": token, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
            for i, token in enumerate(_FAMILY_ADDED[arch])
        ]
    return data


def tokenizer_size(tokenizer: dict) -> int:
    """Entries of ``tokenizer`` (vocabulary plus added tokens outside it)."""
    vocab = tokenizer["model"]["vocab"]
    return len(vocab) + sum(1 for t in tokenizer["added_tokens"] if t["content"] not in vocab)


def token_id(tokenizer: dict, content: str) -> int:
    """Id of added token ``content``.

    Raises:
        ValueError: ``tokenizer`` has no such added token.
    """
    for token in tokenizer["added_tokens"]:
        if token["content"] == content:
            return token["id"]
    raise ValueError(f"tokenizer.json has no added token {content!r}")


def end_of_turn(arch: str) -> str:
    """The token that ends an assistant turn (its lm_head row is calibrated)."""
    return {"glm4_moe": "<|user|>", "gpt_oss": "<|return|>"}.get(arch, "<|im_end|>")


def stop_tokens(arch: str) -> tuple[str, ...]:
    """``generation_config.json`` ``eos_token_id`` tokens, in order."""
    if arch == "glm4_moe":
        return ("<|endoftext|>", "<|user|>", "<|observation|>")
    if arch == "gpt_oss":
        return ("<|return|>", "<|endoftext|>", "<|call|>")
    return ("<|im_end|>", "<|endoftext|>")


def tokenizer_config(arch: str, tokenizer: dict, template: str, max_length: int) -> dict:
    """``tokenizer_config.json`` contents (added-token flags, special-token names, template)."""
    added = {str(t["id"]): {k: t[k] for k in _FLAGS} for t in tokenizer["added_tokens"]}
    specials = [t["content"] for t in tokenizer["added_tokens"] if t["special"]]
    glm, oss = arch == "glm4_moe", arch == "gpt_oss"
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [s for s in specials if s != "<|endoftext|>"],
        "bos_token": "<|startoftext|>" if oss else None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>" if glm else "<|return|>" if oss else "<|im_end|>",
        "errors": "replace",
        "model_max_length": max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast" if glm or oss else "Qwen2Tokenizer",
        "unk_token": None,
    }
