"""Calibrates how often a random-weight checkpoint ends its turn with ``<|im_end|>``.

With random weights ``<|im_end|>`` has probability ~1/V per step, so agent clients would always
run to the output cap. :func:`calibrate_im_end` scales the ``<|im_end|>`` row of ``lm_head`` by a
factor ``s`` chosen so that, over the states of a typical turn, the mean probability of
``<|im_end|>`` at temperature 1 is :data:`TARGET_END_PROB` (a turn then ends after roughly
5-30 tokens). The row's logit is ``s * b_t`` where ``b_t`` is the unscaled logit, so
``p_t(s) = exp(s b_t) / (exp(s b_t) + sum_{j != eos} exp(l_tj))`` is evaluated for every
candidate ``s`` from one set of logits. ``s`` may be negative: in some random models the final
hidden states share one dominant direction and the unscaled row points away from it.

The states come from the model itself: fixed ChatML prompts (gpt-oss: the same two conversations
rendered by its harmony template, whose turns open differently) followed by tokens sampled at
temperature 1 with ``<|im_end|>`` masked, seeded and on one intra-op thread, so the factor is
reproducible.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from freetoken.models.config import ModelConfig
from freetoken.models.loader import Checkpoint
from freetoken.models.registry import load_model
from freetoken.tokenizer.tokenizer import Tokenizer

TARGET_END_PROB = 1 / 16
CALIBRATION_STEPS = 48
SCALE_GRID = torch.arange(1, 801) * 0.25  # |s| in 0.25 .. 200
PROMPTS = (
    "<|im_start|>system\nYou are a helpful coding assistant.<|im_end|>\n<|im_start|>user\n"
    "Write a Python function that reverses a linked list.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n<|im_end|>\n<|im_start|>user\nList the files in the repository and fix the failing "
    "test.<|im_end|>\n<|im_start|>assistant\n",
)


HARMONY_CONVERSATIONS = (
    [{"role": "system", "content": "You are a helpful coding assistant."},
     {"role": "user", "content": "Write a Python function that reverses a linked list."}],
    [{"role": "user", "content": "List the files in the repository and fix the failing test."}],
)


def prompts(model_type: str) -> tuple[str, ...]:
    """The calibration prompts of a family: :data:`PROMPTS`, or for gpt-oss the harmony
    renderings of :data:`HARMONY_CONVERSATIONS` (ChatML is plain text to its tokenizer)."""
    if model_type != "gpt_oss":
        return PROMPTS
    from freetoken.chat.template import ChatTemplate

    template = ChatTemplate.for_model(None, model_type)
    return tuple(template.render(c, current_date="2025-01-01") for c in HARMONY_CONVERSATIONS)


@torch.no_grad()
def turn_logits(path: Path, eos: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """``[2 * CALIBRATION_STEPS, V]`` fp32 logits along seeded temperature-1 turns
    (``<|im_end|>`` masked while sampling) of the checkpoint at ``path`` (:func:`prompts`)."""
    model = load_model(path, dtype=dtype)
    tokenizer = Tokenizer.from_pretrained(path)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for prompt in prompts(model.config.model_type):
        state = model.new_state()
        logits = model(torch.tensor(tokenizer.encode(prompt)), state)[0]
        for _ in range(CALIBRATION_STEPS):
            rows.append(logits)
            masked = logits.clone()
            masked[eos] = float("-inf")
            token = torch.multinomial(torch.softmax(masked, -1), 1, generator=gen)
            logits = model(token, state)[0]
    return torch.stack(rows)


def choose_scale(logits: torch.Tensor, eos: int, target: float = TARGET_END_PROB) -> float:
    """Smallest ``|s|`` on a 0.25 grid (positive first) with mean ``p(<|im_end|>) >= target``.

    Args:
        logits: ``[N, V]`` fp32 logits computed with the unscaled row.
        eos: the ``<|im_end|>`` id.
        target: wanted mean end-of-turn probability per step.

    Raises:
        ValueError: no factor up to 200 reaches the target.
    """
    b = logits[:, eos].double()
    others = torch.cat([logits[:, :eos], logits[:, eos + 1 :]], 1).double().logsumexp(-1)
    for s in SCALE_GRID.tolist():
        for signed in (s, -s):
            p = torch.sigmoid(signed * b - others).mean().item()
            if p >= target:
                return signed
    raise ValueError("no <|im_end|> row scale up to 200 reaches the target end probability")


def choose_scale_by_length(logits: torch.Tensor, eos: int,
                           target: float = TARGET_END_PROB) -> float:
    """Smallest ``|s|`` on a 0.25 grid (positive first) whose turns end after ``1 / (2 target)``
    steps on average: ``E[len] = sum_t prod_{u<t} (1 - p_u(s))`` over each recorded turn (half
    the per-step criterion's ``1 / target``: the recorded turns stop at ``CALIBRATION_STEPS``,
    so longer turns count short).

    Used for gpt-oss, whose turns all start from nearly the same header states: there a mean
    per-step probability of ``target`` can come from the first step alone, ending every turn
    at once.

    Args:
        logits: ``[P, T, V]`` fp32 logits of P turns of T steps (unscaled row).

    Raises:
        ValueError: no factor up to 200 shortens the turns enough.
    """
    b = logits[..., eos].double()
    others = torch.cat([logits[..., :eos], logits[..., eos + 1 :]], -1).double().logsumexp(-1)
    for s in SCALE_GRID.tolist():
        for signed in (s, -s):
            alive = torch.cumprod(1 - torch.sigmoid(signed * b - others), dim=-1)
            length = (1 + alive[:, :-1].sum(-1)).mean().item()
            if length <= 0.5 / target:
                return signed
    raise ValueError("no <|im_end|> row scale up to 200 reaches the target turn length")


def scale_lm_head_row(path: Path, row: int, scale: float) -> None:
    """Multiply row ``row`` of ``lm_head.weight`` by ``scale`` in place on disk (same dtype)."""
    file = Checkpoint.for_config(path, ModelConfig.from_file(path)).files["lm_head.weight"]
    with safe_open(file, framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(file)
    weight = tensors["lm_head.weight"]
    weight[row] = (weight[row].float() * scale).to(weight.dtype)
    save_file(tensors, str(file), metadata=metadata)
    file.chmod(0o644)


def calibrate_im_end(path: Path, eos: int, dtype: torch.dtype, seed: int) -> float:
    """Choose the ``<|im_end|>`` row factor of the checkpoint at ``path`` and apply it on disk.

    Returns:
        the factor ``s``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # same float results whatever the caller's setting; fast on 2 CPUs
    try:
        logits = turn_logits(path, eos, dtype, seed)
    finally:
        torch.set_num_threads(threads)
    if ModelConfig.from_file(path).model_type == "gpt_oss":
        scale = choose_scale_by_length(logits.view(2, CALIBRATION_STEPS, -1), eos)
    else:
        scale = choose_scale(logits, eos)
    scale_lm_head_row(path, eos, scale)
    return scale
