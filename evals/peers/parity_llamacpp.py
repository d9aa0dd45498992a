"""llama.cpp's side of the conversion check: same ids through the GGUF, compared with FreeToken.

Usage (peer venv, which has ``llama_cpp``)::

    python evals/peers/parity_llamacpp.py MODEL.gguf REF.json [--out PARITY.json] [--tol 1e-3]

``REF.json`` comes from ``ref_freetoken.py``. Checks, all on identical token ids:

1. Tokenizer: llama.cpp's ``tokenize(text, add_bos=False, special=True)`` of every text and of
   every rendered chat prompt equals FreeToken's ids.
2. Logits, teacher-forced: the prompt is evaluated in one batch (prefill), then FreeToken's greedy
   tokens one at a time (decode); at every step llama.cpp's log-softmax is compared with
   FreeToken's raw logprobs at FreeToken's top-20 ids (max absolute difference). Both are taken
   over the tokenizer's ids only (``sampleable_vocab``): FreeToken never samples or normalises
   over the padded embedding rows, which would otherwise shift every logprob by
   log(8256 / 8218) ~ 5e-3 on a near-uniform random model.
3. Greedy agreement: the number of leading steps where llama.cpp's argmax equals FreeToken's
   greedy token. Up to the first disagreement this is exactly the shared prefix of the two
   engines' free-running greedy outputs; at a disagreement the FreeToken top-1/top-2 logprob gap
   is reported (a near-tie flipped by float rounding, or a real mismatch).

Exit status 0 when the tokenizer matches, every chat's first-token logprobs agree within
``--tol``, and at least one greedy token agrees per chat; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def compare(gguf_path: str | Path, ref: dict, n_threads: int = 2) -> dict:
    """Run the three checks of the module docstring.

    Args:
        gguf_path: the converted model.
        ref: the parsed ``ref_freetoken.py`` JSON.
        n_threads: llama.cpp CPU threads.

    Returns:
        ``{"texts": {"equal", "total", "mismatches"}, "chats": [{"prompt_tokens",
        "prompt_ids_equal", "n_tokens", "greedy_agree", "first_divergence": None | {"step",
        "freetoken", "llamacpp", "ft_top1_top2_gap"}, "first_token_max_abs_logprob_diff",
        "max_abs_logprob_diff"}], "max_abs_logprob_diff", "first_token_max_abs_logprob_diff"}``.
    """
    longest = max(len(c["prompt_ids"]) + len(c["output_ids"]) for c in ref["chats"])
    # KV cache in f32 (type 0), like FreeToken's float32 compute; llama.cpp's default is f16.
    llm = Llama(model_path=str(gguf_path), n_ctx=max(512, longest + 8), n_batch=512,
                n_threads=n_threads, n_threads_batch=n_threads, logits_all=True, verbose=False,
                type_k=0, type_v=0)
    mismatches = []
    for item in ref["texts"]:
        ids = llm.tokenize(item["text"].encode("utf-8"), add_bos=False, special=True)
        if ids != item["ids"]:
            mismatches.append({"text": item["text"], "freetoken": item["ids"], "llamacpp": ids})
    chats = []
    for chat in ref["chats"]:
        ids = llm.tokenize(chat["prompt"].encode("utf-8"), add_bos=False, special=True)
        chats.append(_compare_chat(llm, chat, ids == chat["prompt_ids"], ref["sampleable_vocab"]))
    return {
        "gguf": str(gguf_path),
        "texts": {"equal": len(ref["texts"]) - len(mismatches), "total": len(ref["texts"]),
                  "mismatches": mismatches},
        "chats": chats,
        "max_abs_logprob_diff": max(c["max_abs_logprob_diff"] for c in chats),
        "first_token_max_abs_logprob_diff": max(c["first_token_max_abs_logprob_diff"]
                                                for c in chats),
    }


def _compare_chat(llm: Llama, chat: dict, prompt_equal: bool, sampleable: int) -> dict:
    prompt, out, steps = chat["prompt_ids"], chat["output_ids"], chat["steps"]
    llm.reset()
    llm.eval(prompt)
    diffs: list[float] = []
    agree, divergence = 0, None
    for i, step in enumerate(steps):
        logp = _log_softmax(np.asarray(llm.scores[llm.n_tokens - 1])[:sampleable])
        top_ids = [t for t, _ in step["top"]]
        ft = np.asarray([p for _, p in step["top"]])
        diffs.append(float(np.abs(logp[top_ids] - ft).max()))
        mine = int(logp.argmax())
        if divergence is None:
            if mine == out[i]:
                agree += 1
            else:
                gap = ft[0] - ft[1] if len(ft) > 1 else float("inf")
                divergence = {"step": i, "freetoken": out[i], "llamacpp": mine,
                              "ft_top1_top2_gap": float(gap),
                              "llamacpp_logprob_of_ft_token": float(logp[out[i]]),
                              "llamacpp_logprob_of_own_token": float(logp[mine])}
        if i + 1 < len(out):
            llm.eval([out[i]])  # teacher forcing: continue on FreeToken's token
    return {"prompt_tokens": len(prompt), "prompt_ids_equal": prompt_equal, "n_tokens": len(out),
            "greedy_agree": agree, "first_divergence": divergence,
            "first_token_max_abs_logprob_diff": diffs[0] if diffs else None,
            "max_abs_logprob_diff": max(diffs) if diffs else None}


def summary_lines(result: dict, tol: float) -> list[str]:
    """Human-readable markdown lines for the comparison report."""
    t = result["texts"]
    lines = [f"- tokenizer: {t['equal']}/{t['total']} texts give identical ids; rendered prompts "
             f"identical: {sum(c['prompt_ids_equal'] for c in result['chats'])}/"
             f"{len(result['chats'])}",
             f"- first-token logprobs (FreeToken's top-20 ids): max |diff| = "
             f"{result['first_token_max_abs_logprob_diff']:.2e} (tolerance {tol:g})",
             f"- all teacher-forced steps: max |diff| = {result['max_abs_logprob_diff']:.2e}"]
    for i, c in enumerate(result["chats"]):
        d = c["first_divergence"]
        tail = ("all agree" if d is None else
                f"first divergence at step {d['step']} (FreeToken top1-top2 gap "
                f"{d['ft_top1_top2_gap']:.2e})")
        lines.append(f"- chat {i} ({c['prompt_tokens']} prompt tokens): greedy tokens agree "
                     f"{c['greedy_agree']}/{c['n_tokens']}, {tail}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """CLI; see the module docstring for the exit status."""
    p = argparse.ArgumentParser(description="llama.cpp vs FreeToken parity on identical ids")
    p.add_argument("gguf")
    p.add_argument("ref")
    p.add_argument("--out", help="write the full result JSON here")
    p.add_argument("--tol", type=float, default=1e-4,
                   help="first-token logprob tolerance (default 1e-4, for f32 weights)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    ref = json.loads(Path(args.ref).read_text(encoding="utf-8"))
    result = compare(args.gguf, ref, args.threads)
    result["tol"] = args.tol
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print("\n".join(summary_lines(result, args.tol)))
    ok = (result["texts"]["equal"] == result["texts"]["total"]
          and all(c["prompt_ids_equal"] and c["greedy_agree"] >= 1 for c in result["chats"])
          and result["first_token_max_abs_logprob_diff"] <= args.tol)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
