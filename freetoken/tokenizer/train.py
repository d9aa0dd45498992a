"""Trains the project's small byte-level BPE tokenizer (run once; the output is committed).

The layout follows the Qwen2/Qwen3 ``tokenizer.json``: NFC normaliser, a regex split
pre-tokenizer followed by byte-level mapping, a byte-level decoder, and the Qwen3 added tokens
with their real ``special`` flags (``<think>``/``<tool_call>``/... are *not* special, so they
survive ``skip_special_tokens``). Source: model-architectures.md §7.1–7.2 (shared research).

Usage: ``python -m freetoken.tokenizer.train [--corpus DIR] [--out DIR]``. The corpus defaults
to this Python installation's standard library sources (code plus English docstrings, the text
coding agents send).
"""

from __future__ import annotations

import argparse
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from freetoken.paths import ASSETS_DIR

BASE_VOCAB_SIZE = 8192
# Qwen2/3 pre-tokenizer split (contractions, letter runs, single digits, punctuation runs,
# newlines, spaces), written out for a Rust-regex engine.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# (content, special) in Qwen3 id order (model-architectures.md §7.2).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
TOKENIZER_DIR = ASSETS_DIR / "tokenizer"


def _corpus(root: Path) -> Iterator[str]:
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def build_tokenizer(corpus_root: Path, vocab_size: int = BASE_VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE of ``vocab_size`` base entries and append the Qwen3 added tokens.

    Args:
        corpus_root: directory whose ``*.py`` files are the training text (non-UTF-8 skipped).
        vocab_size: base BPE vocabulary size (256 byte symbols included).

    Returns:
        The trained ``tokenizers.Tokenizer``; added tokens get ids ``vocab_size ...`` in
        ``ADDED_TOKENS`` order.
    """
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(corpus_root), trainer=trainer)
    from tokenizers import AddedToken

    for content, special in ADDED_TOKENS:
        token = AddedToken(content, single_word=False, lstrip=False, rstrip=False,
                           normalized=False, special=special)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    return tok


def main() -> None:
    """CLI entry: train and write ``tokenizer.json`` into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--out", type=Path, default=TOKENIZER_DIR)
    args = parser.parse_args()
    tok = build_tokenizer(args.corpus)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"))
    print(f"wrote {args.out / 'tokenizer.json'} ({tok.get_vocab_size()} entries)")


if __name__ == "__main__":
    main()
