"""FreeToken's side of the conversion check: greedy tokens and logprobs from the engine.

Usage (project venv)::

    python evals/peers/ref_freetoken.py MODEL_DIR OUT.json [--tokens N] [--dtype float32]

For every chat in ``parity_prompts.CHATS`` the prompt is rendered with the checkpoint's chat
template and tokenised by FreeToken's tokenizer, then decoded greedily by FreeToken's engine
(``AsyncEngine``, temperature 0, ``ignore_eos`` so exactly N tokens come out) with the top-20
raw logprobs of every step (FreeToken normalises over the tokenizer's ids only, not the padded
embedding rows; ``sampleable_vocab`` records that size). ``parity_prompts.TEXTS`` are tokenised
too. The JSON written is read by ``parity_llamacpp.py`` (peer venv), which replays the same ids
through llama.cpp.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from freetoken.chat.template import ChatTemplate  # noqa: E402
from freetoken.core import GenerationRequest, SamplingParams  # noqa: E402
from freetoken.engine.async_engine import AsyncEngine  # noqa: E402
from parity_prompts import CHATS, TEXTS  # noqa: E402

TOP_LOGPROBS = 20


async def _greedy(engine: AsyncEngine, rid: str, prompt: list[int], n: int) -> tuple[list, list]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=TOP_LOGPROBS)
    ids: list[int] = []
    steps: list[dict] = []
    async for chunk in engine.generate(GenerationRequest(rid, tuple(prompt), params)):
        if chunk.finish_reason == "error":
            raise RuntimeError(f"engine error: {chunk.error}")
        ids.extend(chunk.token_ids)
        for lp in chunk.logprobs or ():
            steps.append({"token": lp.token_id, "logprob": lp.logprob,
                          "top": [[t, p] for t, _s, p in lp.top]})
    return ids, steps


def reference(model_dir: str | Path, n_tokens: int, dtype: torch.dtype) -> dict:
    """Greedy outputs of FreeToken's engine on ``CHATS`` and the token ids of ``TEXTS``.

    Returns:
        ``{"model_dir", "dtype", "n_tokens", "sampleable_vocab", "texts": [{"text", "ids"}],
        "chats": [{"messages", "prompt", "prompt_ids", "output_ids", "steps": [{"token",
        "logprob", "top": [[id, logprob]...]}]}], "seconds"}``; logprobs are natural-log raw
        softmax values (float) over the tokenizer's ids.

    Raises:
        FileNotFoundError, ValueError: from the engine's loader.
    """
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    template = ChatTemplate(config["chat_template"], name="checkpoint")
    t0 = time.perf_counter()
    engine = AsyncEngine.from_pretrained(model_dir, dtype=dtype, device="cpu", max_model_len=4096,
                                         progress=lambda s: print(s, file=sys.stderr))
    try:
        tok = engine.tokenizer
        sampleable = tok.vocab_size  # the engine never samples (or normalises over) pad rows
        texts = [{"text": t, "ids": tok.encode(t)} for t in TEXTS]
        chats = []
        for i, messages in enumerate(CHATS):
            prompt = template.render(messages, add_generation_prompt=True)
            prompt_ids = tok.encode(prompt)
            out, steps = asyncio.run(_greedy(engine, f"parity-{i}", prompt_ids, n_tokens))
            chats.append({"messages": messages, "prompt": prompt, "prompt_ids": prompt_ids,
                          "output_ids": out, "steps": steps})
    finally:
        engine.shutdown()
    return {"model_dir": str(model_dir), "dtype": str(dtype).removeprefix("torch."),
            "n_tokens": n_tokens, "sampleable_vocab": sampleable, "texts": texts, "chats": chats,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    """CLI: write the reference JSON; exit 0."""
    p = argparse.ArgumentParser(description="FreeToken greedy reference for the GGUF parity check")
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--tokens", type=int, default=48, help="greedy tokens per chat (default 48)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = p.parse_args(argv)
    ref = reference(args.model_dir, args.tokens, getattr(torch, args.dtype))
    Path(args.out).write_text(json.dumps(ref), encoding="utf-8")
    print(f"reference: {len(ref['chats'])} chats x {args.tokens} tokens in {ref['seconds']} s "
          f"-> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
