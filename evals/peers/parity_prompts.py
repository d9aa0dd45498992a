"""Project-written prompts and texts for the FreeToken <-> llama.cpp conversion check.

``CHATS`` are rendered through the checkpoint's own chat template on both sides; ``TEXTS`` are
tokenised by both tokenisers and must give identical ids (they cover ASCII words, digits,
contractions, runs of spaces and newlines, punctuation, code and non-ASCII letters; all NFC, see
``gguf_vocab``'s note on normalisation).
"""

from __future__ import annotations

CHATS: list[list[dict]] = [
    [{"role": "user", "content": "Write a haiku about unit tests."}],
    [{"role": "system", "content": "You are a careful coding assistant."},
     {"role": "user", "content": "Explain what a KV cache stores during decode, in two sentences."}],
    [{"role": "user", "content": "def add(a, b):\n    return a - b\n\nThe test says add(2, 3) == 5. Fix it."},
     {"role": "assistant", "content": "The function subtracts; it should add."},
     {"role": "user", "content": "Show the patched file."}],
    [{"role": "user", "content": "List three prime numbers above 100 and say why each is prime."}],
]

TEXTS: list[str] = [
    "Hello world! It's 2026, and we've 12345 tests; they'll pass.",
    "def f(x):\n\treturn x**2  # square\n\n\n    indented   spaces\r\nend",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "Ünïcödé café naïve — “quotes” and ellipsis… 日本語のテキスト 🦙",
    "   leading spaces, trailing spaces   \n\n\n\nand many newlines",
    "{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/main.py\"}}",
]
