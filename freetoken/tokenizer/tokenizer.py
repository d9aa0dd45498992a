"""Loads a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json).

Follows the HF file layout: ``tokenizer.json`` (the ``tokenizers`` library format),
``tokenizer_config.json`` (special-token names, ``chat_template``), an optional
``chat_template.jinja`` (newer repos keep the template there) and ``generation_config.json``
(the stop ids, often a list).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token_content(value: object) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


# Reasoning and tool-call tags the output parsers read in generated text. Qwen tokenizers mark
# them non-special; GLM-4.5 marks them special, and so does gpt-oss for the harmony tokens that
# frame its messages (channel, recipient, end of message), so a "skip special tokens" rule alone
# would drop them from the text and lose the reasoning split and the calls.
MARKUP_TOKENS = frozenset({
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>",
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>",
    "<|return|>",
})


@dataclass
class Tokenizer:
    """Byte-level BPE tokenizer of a checkpoint.

    Attributes:
        path: the directory it was loaded from.
        eos_token_ids: ids that end generation, from generation_config.json, config.json and
            tokenizer_config.json's ``eos_token`` (deduplicated, in that order).
        chat_template: the checkpoint's own jinja chat template, or None.
        special_ids: ids of the added tokens marked special that generated text leaves out;
            the markup tags of :data:`MARKUP_TOKENS` are kept even when marked special.
    """

    path: Path
    hf: _HFTokenizer
    eos_token_ids: tuple[int, ...]
    chat_template: str | None
    special_ids: frozenset[int]

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "Tokenizer":
        """Load ``path/tokenizer.json`` and the side files.

        Raises:
            FileNotFoundError: ``tokenizer.json`` is missing.
        """
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path}")
        hf = _HFTokenizer.from_file(str(tok_file))
        tcfg = _read_json(path / "tokenizer_config.json")
        gcfg = _read_json(path / "generation_config.json")
        mcfg = _read_json(path / "config.json")
        eos: list[int] = []
        for src in (gcfg.get("eos_token_id"), mcfg.get("eos_token_id")):
            for i in src if isinstance(src, list) else [src]:
                if isinstance(i, int) and i not in eos:
                    eos.append(i)
        name = _token_content(tcfg.get("eos_token"))
        if name is not None and hf.token_to_id(name) is not None and hf.token_to_id(name) not in eos:
            eos.append(hf.token_to_id(name))
        template = tcfg.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        special = frozenset(i for i, t in hf.get_added_tokens_decoder().items()
                            if t.special and t.content not in MARKUP_TOKENS)
        return cls(path, hf, tuple(eos), template, special)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce (including added tokens)."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    @cached_property
    def added_token_strings(self) -> tuple[str, ...]:
        """The text of every added token, special or not (``<|im_end|>``, ``<think>``…), longest
        first, so a regex alternation over them matches the longest token at a position."""
        contents = {t.content for t in self.hf.get_added_tokens_decoder().values() if t.content}
        return tuple(sorted(contents, key=lambda c: (-len(c), c)))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; added tokens written in the text (``<|im_start|>``) map to their ids.

        Goes through ``encode_batch``, which releases the GIL (the single ``encode`` holds it for
        seconds on a megabyte prompt, freezing the server's event loop even from a worker thread).
        """
        return self.encode_many([text])[0]

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each of ``texts`` (as :meth:`encode`), in one GIL-releasing batch call."""
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` read as plain characters: an added token written in it
        (``<|im_end|>``, ``<think>``) becomes the ids of its characters, never its own id.

        Runs the normalizer, pre-tokenizer and model directly: the library's
        ``encode_special_tokens`` switch leaves non-special added tokens (Qwen's ``<think>``)
        matched. Meant for short strings (it holds the GIL).
        """
        hf = self.hf
        if hf.normalizer is not None:
            text = hf.normalizer.normalize_str(text)
        pieces = [(text, None)]
        if hf.pre_tokenizer is not None:
            pieces = hf.pre_tokenizer.pre_tokenize_str(text)
        return [token.id for piece, _ in pieces for token in hf.model.tokenize(piece)]

    def decode(self, ids: list[int] | tuple[int, ...], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 byte sequences decode to U+FFFD."""
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry (e.g. ``"<|im_end|>"``), or None."""
        return self.hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Vocabulary entry of ``token_id`` (byte-level form), or None."""
        return self.hf.id_to_token(token_id)
