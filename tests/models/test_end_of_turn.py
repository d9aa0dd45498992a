"""The calibrated end-of-turn row (<|im_end|>, GLM <|user|>, gpt-oss <|return|>): sampled turns of the tiny models end
after roughly 5-30 tokens."""

from __future__ import annotations

import statistics

import pytest
import torch

from freetoken.chat.template import ChatTemplate
from freetoken.models.registry import load_model
from freetoken.models.tiny_tokens import end_of_turn
from freetoken.tokenizer.tokenizer import Tokenizer

PROMPTS = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>system\nYou are an interactive CLI tool that helps users with software engineering "
    "tasks.<|im_end|>\n<|im_start|>user\nFix the failing test in tests/test_parser.py and explain "
    "the change.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a Python function that reverses a linked list.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    '<|im_start|>system\n# Tools\n\n<tools>\n{"type": "function", "function": {"name": "bash", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}\n</tools>'
    "<|im_end|>\n<|im_start|>user\nList the files in the repo.<|im_end|>\n<|im_start|>assistant\n",
)
# gpt-oss reads harmony, to which ChatML is plain text: the same conversations in its format
HARMONY = (
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You are an interactive CLI tool that helps users with "
                                   "software engineering tasks."},
     {"role": "user", "content": "Fix the failing test in tests/test_parser.py and explain the "
                                 "change."}],
    [{"role": "user", "content": "Write a Python function that reverses a linked list."}],
    [{"role": "user", "content": "List the files in the repo."}],
)
TURNS_PER_PROMPT = 8
CAP = 200


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_next", "qwen3_5_moe", "glm4_moe", "gpt_oss"])
def test_sampled_turns_end(arch: str, tiny_checkpoint) -> None:
    path = tiny_checkpoint(arch)
    model, tok = load_model(path), Tokenizer.from_pretrained(path)
    im_end = tok.token_to_id(end_of_turn(arch))
    gen = torch.Generator().manual_seed(123)
    lengths = []
    prompts = PROMPTS
    if arch == "gpt_oss":
        template = ChatTemplate.for_model(None, arch)
        prompts = [template.render(c, current_date="2025-01-01") for c in HARMONY]
    for prompt in prompts:
        ids = torch.tensor(tok.encode(prompt))
        for _ in range(TURNS_PER_PROMPT):
            state = model.new_state()
            logits = model(ids, state)
            for n in range(1, CAP + 1):
                token = torch.multinomial(torch.softmax(logits[0], -1), 1, generator=gen)
                if int(token) == im_end:
                    break
                logits = model(token, state)
            lengths.append(n)
    assert 5 <= statistics.mean(lengths) <= 30, sorted(lengths)
    assert max(lengths) < CAP, sorted(lengths)
