"""Policy replay: miss rate of each eviction policy and baseline at equal capacity on routing traces
recorded by the engine while serving real trace text from ../shared/traces (issue 3, bench item 3).

Steps: (1) render a few W2/W3 coding-agent conversations with the model's chat template and
tokenizer (:mod:`evals.trace_prompts`: the latest model call whose prompt fits
``--max-prompt-tokens``, else that many leading tokens of the first call); (2) run the model over
each, one prefill forward then ``--decode-tokens`` greedy decode steps (end-of-turn is ignored,
so every conversation decodes the same count), recording every MoE layer's top-k ids with
:class:`freetoken.offload.recorder.RoutingRecorder` installed as the model's routing observer,
exactly as ``serve --record-routing`` does; (3) save the ``.npz`` and replay it through
``evals.replay_routing.run_trace`` at each pool fraction. The cache state carries over from one
conversation to the next, as in a server. Miss rate = 1 - hit rate over the scored decode steps
(prefill and the first ``--warmup-frac`` of decode steps warm the cache unscored).

Caveat: the default checkpoint (and the ``make-tiny`` presets) hold seeded random weights, so
their routing has none of a trained model's expert locality; the table then only exercises the
pipeline. Pass ``--model`` with a real checkpoint for meaningful numbers.

Run: ``python -m evals.bench_moe_replay [--model DIR] [--decode-tokens 64]``: about 35 s on the
tiny model with 2 CPU cores; 4-7 min on the ``small`` preset (12 x 64 experts, 1.2 GB).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import torch

from evals.replay_routing import COLUMNS, run_trace
from evals.trace_prompts import DEFAULT_TRACES, conversation_prompt
from freetoken.chat.template import ChatTemplate
from freetoken.models.registry import load_model
from freetoken.models.tiny import STAMP_FILE
from freetoken.offload.recorder import RoutingRecorder
from freetoken.tokenizer.tokenizer import Tokenizer

DEFAULT_CONVERSATIONS = (
    "W2_coding_agent_swebench/sweagent_demo_marshmallow-1867_function_calling.jsonl",
    "W2_coding_agent_opencode/opencode_part_updated_events__session1.jsonl",
    "W3_claude_code/cc_session_5c0375b4__main.jsonl",
)
POLICIES = [c for c in COLUMNS if "/" not in c]  # hit-rate columns (ratios left out)
RANDOM_WEIGHTS_NOTE = ("note: seeded-random (make-tiny) weights route without a trained model's "
                       "locality; these miss rates only exercise the pipeline")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options (``argv`` None: ``sys.argv``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None,
                    help="checkpoint directory (default: the embedded tiny qwen3_next)")
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="../shared/traces folder")
    ap.add_argument("--conversations", nargs="+", default=list(DEFAULT_CONVERSATIONS),
                    help="conversation files, relative to --traces")
    ap.add_argument("--max-prompt-tokens", type=int, default=2048)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--out", type=Path,
                    default=Path(tempfile.gettempdir()) / "freetoken-bench" / "moe_replay.npz",
                    help="where the recorded routing trace is written")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    ap.add_argument("--warmup-frac", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.max_prompt_tokens < 1 or args.decode_tokens < 1:
        ap.error("--max-prompt-tokens and --decode-tokens must be >= 1")
    if not all(0 < f <= 1 for f in args.fractions) or not 0 <= args.warmup_frac < 1:
        ap.error("fractions must lie in (0, 1] and --warmup-frac in [0, 1)")
    return args


def record_conversations(args: argparse.Namespace) -> tuple[Path, int, int, str]:
    """Run the model over the conversations and save the routing trace.

    Returns:
        ``(trace path, prefill tokens, decode tokens, model path)``.

    Raises:
        ValueError: a model without MoE layers. FileNotFoundError: a missing conversation.
    """
    if args.model is None:
        from freetoken.models.tiny import default_model_path

        args.model = default_model_path()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = load_model(args.model, dtype=dtype)
    tokenizer = Tokenizer.from_pretrained(args.model)
    template = ChatTemplate.for_model(tokenizer.chat_template, model.config.model_type)
    cfg = model.config
    num_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    if not num_moe:
        raise ValueError(f"{args.model} has no MoE layers")
    recorder = RoutingRecorder(args.out, num_layers=num_moe, num_experts=cfg.num_experts,
                               top_k=cfg.num_experts_per_tok, model=str(args.model))
    model.set_routing_observer(recorder.record)  # what --record-routing installs
    vocab = min(tokenizer.vocab_size, cfg.vocab_size)
    prefill = decode = 0
    try:
        for seq, name in enumerate(args.conversations):
            ids = conversation_prompt(args.traces / name, tokenizer, template,
                                      args.max_prompt_tokens)
            state = model.new_state()
            recorder.begin_step(seq, 0)
            logits = model(torch.tensor(ids), state)
            prefill += len(ids)
            for _ in range(args.decode_tokens):
                token = int(logits[0, :vocab].argmax())
                recorder.begin_step(seq, 1)
                logits = model(torch.tensor([token]), state)
                decode += 1
    finally:
        model.set_routing_observer(None)
    return recorder.save(), prefill, decode, str(args.model)


def _miss(cell: str) -> float:
    return float("nan") if cell == "-" else 1.0 - float(cell)


def run(args: argparse.Namespace) -> list[dict]:
    """Record, replay and print the miss-rate table.

    Returns:
        one dict per pool fraction: ``fraction``, ``slots``, ``scored_steps``, ``accesses`` and
        ``miss_rate`` (policy name -> 1 - hit rate, NaN where undefined), plus ``trace``,
        ``model``, ``prefill_tokens``, ``decode_tokens``, ``random_weights`` (a ``make-tiny``
        checkpoint: its stamp file is present).
    """
    if not args.traces.is_dir():
        raise SystemExit(f"bench_moe_replay: no traces folder at {args.traces}; pass --traces DIR "
                         "(the project's shared/traces) or set FREETOKEN_SHARED")
    t0 = time.perf_counter()
    path, prefill, decode, model = record_conversations(args)
    recorded_s = time.perf_counter() - t0
    rows = run_trace(path, list(args.fractions), args.warmup_frac, args.seed)
    results = []
    for frac, row in zip(args.fractions, rows):
        steps, accesses = row[4].split("/")
        cells = dict(zip(COLUMNS, row[5:]))
        results.append({
            "trace": str(path), "model": model, "layers_x_experts": row[2],
            "prefill_tokens": prefill, "decode_tokens": decode, "fraction": frac,
            "slots": int(row[3].split()[0]), "scored_steps": int(steps),
            "accesses": int(accesses), "miss_rate": {p: _miss(cells[p]) for p in POLICIES},
            "random_weights": (Path(model) / STAMP_FILE).is_file(),
        })
    _print(results, recorded_s, time.perf_counter() - t0)
    return results


def _print(results: list[dict], recorded_s: float, total_s: float) -> None:
    first = results[0]
    print(f"model {first['model']} ({first['layers_x_experts']} MoE layers x experts): "
          f"{first['prefill_tokens']} prefill + {first['decode_tokens']} decode tokens recorded "
          f"in {recorded_s:.1f} s -> {first['trace']}")
    header = ["S (frac)", "steps/acc"] + POLICIES
    table = [header] + [
        [f"{r['slots']} ({r['fraction']:g})", f"{r['scored_steps']}/{r['accesses']}"]
        + ["-" if math.isnan(r["miss_rate"][p]) else f"{r['miss_rate'][p]:.3f}" for p in POLICIES]
        for r in results
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"decode miss rate (1 - hit rate), lower is better; total {total_s:.1f} s")
    if first["random_weights"]:
        print(RANDOM_WEIGHTS_NOTE)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: ``python -m evals.bench_moe_replay``."""
    run(parse_args(argv))


if __name__ == "__main__":
    main()
