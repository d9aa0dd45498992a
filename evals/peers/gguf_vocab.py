"""The tokenizer part of a GGUF file, built from a checkpoint's ``tokenizer.json``.

llama.cpp's "gpt2" tokenizer model is byte-level BPE: the token list holds each token's
byte-level string (``"Ġthe"``), ``tokenizer.ggml.merges`` holds ``"left right"`` pairs in rank
order, and ``tokenizer.ggml.pre`` names the pre-tokenizer regex llama.cpp applies before BPE
(``src/llama-vocab.cpp``, ``llama_vocab::impl::load``; the names and the regex each one selects are
listed in ``llm_tokenizer_bpe``'s constructor). Token types follow gguf-py's ``TokenType``:
NORMAL for BPE vocabulary, CONTROL for special added tokens, USER_DEFINED for other added tokens,
UNUSED for padding rows of the embedding (``vocab_size`` is rounded up past the tokenizer).

FreeToken's committed tokenizer (``freetoken/assets/tokenizer/tokenizer.json``) splits with the
same regex as the Qwen2 family (``QWEN2_SPLIT_REGEX``); llama.cpp's "qwen2" pre-tokenizer is
documented in ``llama-vocab.cpp`` as that exact regex, so ``tokenizer.ggml.pre = "qwen2"``.
A tokenizer with any other split regex is refused rather than silently mis-tokenised.
Known gap: the tokenizer's NFC normaliser has no llama.cpp counterpart, so text that is not
already NFC-normalised tokenises differently (ASCII and pre-composed text are unaffected).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# gguf-py TokenType values (gguf/constants.py, class TokenType).
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


@dataclass(frozen=True)
class GgufVocab:
    """Everything llama.cpp needs to tokenise like the checkpoint.

    Attributes:
        tokens: one string per id, ``len == vocab_size`` (padding rows are ``"[PAD<i>]"``).
        token_types: gguf TokenType per id.
        merges: BPE merges as ``"left right"``, highest priority first.
        pre: the ``tokenizer.ggml.pre`` name.
        bos_id, eos_id, pad_id: special ids (bos/pad ``<|endoftext|>``, eos ``<|im_end|>``).
        chat_template: the Jinja chat template of ``tokenizer_config.json``.
    """

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    bos_id: int
    eos_id: int
    pad_id: int | None
    chat_template: str | None


def load_vocab(model_dir: str | Path, vocab_size: int, bos_id: int | None) -> GgufVocab:
    """Read ``tokenizer.json`` + ``tokenizer_config.json`` of ``model_dir``.

    Args:
        model_dir: checkpoint directory.
        vocab_size: rows of the embedding (``config.json`` ``vocab_size``), >= tokenizer size.
        bos_id: ``config.json`` ``bos_token_id`` (None: ``<|endoftext|>``).

    Raises:
        FileNotFoundError: ``tokenizer.json`` missing.
        ValueError: not a byte-level BPE tokenizer, a pre-tokenizer regex llama.cpp's "qwen2"
            does not implement, an id >= vocab_size, or an eos/pad token not in the vocabulary.
    """
    model_dir = Path(model_dir)
    data = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    config_file = model_dir / "tokenizer_config.json"
    tok_config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    model = data["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"tokenizer model {model.get('type')!r} is not BPE")
    regex = _split_regex(data.get("pre_tokenizer"))
    if regex != QWEN2_SPLIT_REGEX:
        raise ValueError(f"pre-tokenizer regex {regex!r} has no known llama.cpp pre-tokenizer; "
                         f"only the Qwen2 regex ('qwen2') is mapped")

    tokens: list[str | None] = [None] * vocab_size
    types = [UNUSED] * vocab_size
    for text, idx in model["vocab"].items():
        _place(tokens, types, idx, text, NORMAL, vocab_size)
    by_text: dict[str, int] = dict(model["vocab"])
    for added in data.get("added_tokens", []):
        kind = CONTROL if added["special"] or _looks_special(added["content"]) else USER_DEFINED
        _place(tokens, types, added["id"], added["content"], kind, vocab_size)
        by_text[added["content"]] = added["id"]
    final = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]

    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    eos_text = _token_text(tok_config.get("eos_token")) or "<|im_end|>"
    pad_text = _token_text(tok_config.get("pad_token"))
    if eos_text not in by_text:
        raise ValueError(f"eos token {eos_text!r} is not in the vocabulary")
    if pad_text is not None and pad_text not in by_text:
        raise ValueError(f"pad token {pad_text!r} is not in the vocabulary")
    bos = bos_id if bos_id is not None else by_text["<|endoftext|>"]
    return GgufVocab(tokens=final, token_types=types, merges=merges, pre="qwen2", bos_id=bos,
                     eos_id=by_text[eos_text],
                     pad_id=by_text[pad_text] if pad_text is not None else None,
                     chat_template=tok_config.get("chat_template"))


def _place(tokens: list, types: list, idx: int, text: str, kind: int, vocab_size: int) -> None:
    if not 0 <= idx < vocab_size:
        raise ValueError(f"token {text!r} has id {idx} outside vocab_size {vocab_size}")
    tokens[idx] = text
    types[idx] = kind


def _looks_special(text: str) -> bool:
    # ChatML-style markers are control tokens even when a tokenizer leaves `special` false.
    return text.startswith("<|") and text.endswith("|>")


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # AddedToken serialisation {"content": ...}
        return value.get("content")
    return value


def _split_regex(pre: dict | None) -> str | None:
    """The Split regex of a ``Sequence[Split, ByteLevel(use_regex=false)]`` pre-tokenizer."""
    if not pre:
        return None
    parts = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    found = None
    for part in parts:
        if part.get("type") == "Split":
            found = part["pattern"].get("Regex")
        elif part.get("type") == "ByteLevel" and part.get("use_regex", True):
            raise ValueError("ByteLevel pre-tokenizer with its own GPT-2 regex is not mapped")
    return found
