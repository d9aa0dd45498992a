"""Incremental detokenisation: turn a stream of token ids into text chunks as they arrive.

Byte-level BPE (GPT-2 / Qwen / DeepSeek / gpt-oss tokenizers) stores every token as a run of
bytes written with printable stand-in characters (GPT-2 ``bytes_to_unicode``), and a token may
hold only part of a multi-byte UTF-8 character (emoji, CJK). For those tokenizers
:class:`ByteLevelDetokenizer` maps each new token to its bytes and feeds them to an incremental
UTF-8 decoder, which holds an incomplete trailing character until its last byte arrives and
replaces invalid sequences with U+FFFD exactly as ``tokenizers``' ``decode`` does
(``String::from_utf8_lossy`` and Python's ``errors="replace"`` both substitute one U+FFFD per
maximal invalid subpart, Unicode §3.9 U+FFFD substitution). Work per token is O(1).

Other decoders (SentencePiece-style ``Metaspace``/``ByteFallback``) use
:class:`WindowDetokenizer`, the prefix/read-offset scheme of vLLM's ``detokenize_incrementally``:
decode a short window of recent ids and emit the new suffix once it no longer ends in U+FFFD.

In both, the concatenation of all returned chunks plus :meth:`flush` equals
``tokenizer.decode(all ids, skip_special_tokens=True)``: added tokens flagged ``special``
(``<|im_end|>``, ``<|im_start|>``, ``<|endoftext|>``) never reach the text, as in vLLM's default,
while the non-special markers the downstream parsers need (``<think>``, ``<tool_call>``) stay.
The byte-level path also keeps those markers where a tokenizer flags them special (GLM-4.5's
tags, gpt-oss's harmony ``<|channel|>`` / ``<|message|>`` / ``<|end|>``…;
``Tokenizer.special_ids`` leaves them out).
"""

from __future__ import annotations

import codecs
from functools import lru_cache

from tokenizers import decoders

from freetoken.tokenizer.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"
# A UTF-8 character spans at most 4 bytes, so once this many tokens are unresolved the trailing
# U+FFFD is a genuinely invalid sequence, not an incomplete character.
_MAX_UNRESOLVED_TOKENS = 4


@lru_cache(maxsize=1)
def byte_level_char_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's ``bytes_to_unicode`` table: stand-in character -> byte value.

    Printable Latin-1 bytes (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for themselves;
    the remaining 68 bytes are written as U+0100 onwards in increasing byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenBytes:
    """Cached ``token id -> bytes`` for a byte-level tokenizer (shared by all requests).

    Mirrors the ``tokenizers`` ByteLevel decoder: a vocabulary entry whose characters are all
    byte stand-ins maps to those bytes; any other entry (e.g. an added token containing a space)
    maps to its own UTF-8 encoding.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, bytes] = {}
        self._char_to_byte = byte_level_char_to_byte()

    def __call__(self, token_id: int) -> bytes:
        """Bytes of ``token_id``; empty for a special token and for an id the tokenizer does
        not know (a padded embedding row), both of which ``decode(skip_special_tokens=True)``
        also skips."""
        cached = self._cache.get(token_id)
        if cached is not None:
            return cached
        token = self._tokenizer.id_to_token(token_id)
        if token is None or token_id in self._tokenizer.special_ids:
            return b""
        table = self._char_to_byte
        if all(c in table for c in token):
            data = bytes(table[c] for c in token)
        else:
            data = token.encode("utf-8")
        self._cache[token_id] = data
        return data


class ByteLevelDetokenizer:
    """Per-request incremental detokeniser for byte-level BPE tokenizers (O(1) per token)."""

    def __init__(self, token_bytes: TokenBytes) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        """Text completed by ``token_id`` (may be empty while a character is incomplete)."""
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """Text of any held incomplete bytes (U+FFFD each), at the end of the stream."""
        return self._decoder.decode(b"", final=True)


class WindowDetokenizer:
    """Per-request incremental detokeniser for any decoder (O(window) per token).

    Keeps ``prefix_offset`` (start of the context window) and ``read_offset`` (end of the text
    already emitted); each step decodes ``ids[prefix_offset:]`` and emits what follows the
    window's already-emitted text, unless it ends in U+FFFD (an incomplete character), in
    which case the text is held for up to four tokens.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text = ""

    def add(self, token_id: int) -> str:
        """Text completed by ``token_id`` (may be empty while a character is incomplete)."""
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids[self._prefix_offset :], skip_special_tokens=True)
        unresolved = len(self._ids) - self._read_offset
        held = text.endswith(REPLACEMENT) or len(text) <= len(self._prefix_text)
        if held and unresolved < _MAX_UNRESOLVED_TOKENS:
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """Text held back at the end of the stream."""
        if self._read_offset == len(self._ids):
            return ""
        return self._advance(self._tokenizer.decode(self._ids[self._prefix_offset :], skip_special_tokens=True))

    def _advance(self, text: str) -> str:
        delta = text[len(self._prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset :], skip_special_tokens=True)
        return delta


def is_byte_level(tokenizer: Tokenizer) -> bool:
    """True when the tokenizer's decoder is the plain ``ByteLevel`` decoder."""
    return isinstance(tokenizer.hf.decoder, decoders.ByteLevel)


class DetokenizerFactory:
    """Makes one incremental detokeniser per request for a given tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._token_bytes = TokenBytes(tokenizer) if is_byte_level(tokenizer) else None

    def __call__(self) -> ByteLevelDetokenizer | WindowDetokenizer:
        """A fresh detokeniser with no tokens consumed."""
        if self._token_bytes is not None:
            return ByteLevelDetokenizer(self._token_bytes)
        return WindowDetokenizer(self._tokenizer)
