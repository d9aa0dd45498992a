"""Incremental detokenisation: UTF-8 safety, equality with tokenizer.decode, O(1) byte path."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models

from freetoken.engine.detokenizer import (
    REPLACEMENT,
    ByteLevelDetokenizer,
    DetokenizerFactory,
    TokenBytes,
    WindowDetokenizer,
    byte_level_char_to_byte,
)
from freetoken.tokenizer.tokenizer import Tokenizer

from tests.engine.helpers import tokenizer

TEXT = "Hi 😀 世界 🎉 naïve café — done <think>ok</think><tool_call>{}</tool_call>"


def _stream(detok, ids: list[int]) -> list[str]:
    return [detok.add(i) for i in ids] + [detok.flush()]


def test_byte_table_is_a_bijection_over_256_bytes() -> None:
    table = byte_level_char_to_byte()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 32 and table["Ċ"] == 10 and table["!"] == 33 and table["ÿ"] == 255


def test_emoji_and_cjk_are_never_split() -> None:
    tok = tokenizer()
    ids = tok.encode(TEXT)
    # The tokenizer really does split characters: some tokens alone decode to U+FFFD.
    assert any(tok.decode([i]) == REPLACEMENT for i in ids)
    chunks = _stream(DetokenizerFactory(tok)(), ids)
    assert all(REPLACEMENT not in c for c in chunks)
    assert "".join(chunks) == TEXT == tok.decode(ids, skip_special_tokens=True)
    emoji = tok.encode("😀")
    assert len(emoji) == 4  # four single-byte tokens
    assert _stream(DetokenizerFactory(tok)(), emoji) == ["", "", "", "😀", ""]


def test_markers_stay_and_special_tokens_are_skipped() -> None:
    tok = tokenizer()
    # <think> </think> <tool_call> </tool_call> are added but not special; <|im_start|>,
    # <|im_end|> and <|endoftext|> are special and never reach the text (vLLM's default).
    ids = [8216, *tok.encode("x"), 8217, 8206, 8207, 8193, 8194, 8192, *tok.encode("y")]
    for detok in (DetokenizerFactory(tok)(), WindowDetokenizer(tok)):
        assert "".join(_stream(detok, ids)) == "<think>x</think><tool_call></tool_call>y"
    assert tok.decode(ids, skip_special_tokens=True) == "<think>x</think><tool_call></tool_call>y"


def test_random_id_streams_equal_decode_including_invalid_bytes() -> None:
    tok = tokenizer()
    rng = random.Random(0)
    byte_tokens = [tok.token_to_id(c) for c in byte_level_char_to_byte()]
    pool = byte_tokens + list(range(tok.vocab_size))
    for _ in range(200):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 25))]
        assert "".join(_stream(DetokenizerFactory(tok)(), ids)) == tok.decode(ids, skip_special_tokens=True), ids


def test_incomplete_character_at_end_flushes_like_decode() -> None:
    tok = tokenizer()
    ids = tok.encode("a😀")[:-1]  # drop the emoji's last byte
    detok = DetokenizerFactory(tok)()
    assert [detok.add(i) for i in ids] == ["a", "", "", ""]
    assert detok.flush() == REPLACEMENT == tok.decode(ids, skip_special_tokens=True)[1:]


def test_unknown_id_decodes_to_nothing_like_decode() -> None:
    tok = tokenizer()
    assert TokenBytes(tok)(tok.vocab_size + 5) == b""
    assert tok.decode([tok.vocab_size + 5]) == ""


class _CountingTokenizer:
    """Wraps a Tokenizer and counts decode() calls."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner, self.hf, self.decodes = inner, inner.hf, 0
        self.special_ids = inner.special_ids

    def decode(self, ids, skip_special_tokens=False):
        self.decodes += 1
        return self.inner.decode(ids, skip_special_tokens)

    def id_to_token(self, token_id):
        return self.inner.id_to_token(token_id)


def test_byte_level_path_is_constant_work_per_token() -> None:
    counting = _CountingTokenizer(tokenizer())
    detok = DetokenizerFactory(counting)()  # type: ignore[arg-type]
    assert isinstance(detok, ByteLevelDetokenizer)
    ids = tokenizer().encode(TEXT * 20)
    assert "".join(_stream(detok, ids)) == TEXT * 20
    assert counting.decodes == 0  # never re-decodes the growing text


def _sentencepiece_like(tmp_path: Path) -> Tokenizer:
    """A Metaspace + ByteFallback tokenizer (Llama/Mistral style decoder chain)."""
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for word in ("▁hello", "▁world", "▁caf", "é", "▁"):
        vocab[word] = len(vocab)
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    hf.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return Tokenizer(tmp_path, hf, (), None, frozenset())


def test_window_detokenizer_for_byte_fallback_decoders(tmp_path: Path) -> None:
    tok = _sentencepiece_like(tmp_path)
    detok = DetokenizerFactory(tok)()
    assert isinstance(detok, WindowDetokenizer)
    v = tok.hf.get_vocab()
    ids = [v["▁hello"], v["▁world"], v["▁"], *(v[f"<0x{b:02X}>"] for b in "😀".encode()),
           v["▁caf"], v["é"], v["▁"], *(v[f"<0x{b:02X}>"] for b in "世".encode())]
    chunks = _stream(detok, ids)
    assert all(REPLACEMENT not in c for c in chunks)
    assert "".join(chunks) == tok.decode(ids, skip_special_tokens=True) == "hello world 😀 café 世"
    assert chunks[3:7] == ["", "", "", "😀"]


def test_window_detokenizer_matches_decode_on_byte_level_text() -> None:
    tok = tokenizer()
    ids = tok.encode(TEXT)
    chunks = _stream(WindowDetokenizer(tok), ids)
    assert all(REPLACEMENT not in c for c in chunks)
    assert "".join(chunks) == TEXT


def test_window_detokenizer_releases_genuinely_invalid_bytes(tmp_path: Path) -> None:
    tok = _sentencepiece_like(tmp_path)
    v = tok.hf.get_vocab()
    ids = [v["▁hello"], *([v["<0xFF>"]] * 6), v["▁world"]]
    chunks = _stream(WindowDetokenizer(tok), ids)
    assert "".join(chunks) == tok.decode(ids, skip_special_tokens=True)
    assert chunks[-2] != ""  # " world" is not held hostage by the invalid bytes


def test_markup_tags_a_tokenizer_flags_special_stay_in_the_text(tiny_checkpoint) -> None:
    """GLM-4.5 flags its think / tool-call tags special: they still reach the text (the parsers
    read them), its other special tokens do not."""
    tok = Tokenizer.from_pretrained(tiny_checkpoint("glm4_moe"))
    text = "<tool_call>bash\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>"
    ids = tok.encode("[gMASK]<sop><think>x</think>" + text + "<|user|>")
    assert tok.token_to_id("<arg_key>") not in tok.special_ids
    assert tok.token_to_id("[gMASK]") in tok.special_ids
    detok = DetokenizerFactory(tok)()
    assert isinstance(detok, ByteLevelDetokenizer)
    out = "".join(detok.add(i) for i in ids) + detok.flush()
    assert out == "<think>x</think>" + text


def test_harmony_tokens_stay_in_the_text(harmony_tokenizer) -> None:
    """gpt-oss flags its harmony tokens special: the ones that frame messages still reach the
    text (HarmonyParser reads them), <|startoftext|> / <|endoftext|> / <|endofprompt|> do not."""
    tok = harmony_tokenizer
    text = ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.f <|constrain|>json<|message|>{"a":1}<|call|><|return|>')
    ids = tok.encode("<|startoftext|>" + text + "<|endofprompt|><|endoftext|>")
    assert tok.token_to_id("<|channel|>") not in tok.special_ids
    assert tok.token_to_id("<|endoftext|>") in tok.special_ids
    detok = DetokenizerFactory(tok)()
    assert isinstance(detok, ByteLevelDetokenizer)
    assert "".join(detok.add(i) for i in ids) + detok.flush() == text
