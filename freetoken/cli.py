"""The ``freetoken`` command line: ``serve`` and ``make-tiny``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _int_at_least(low: int, high: int | None = None):
    """argparse ``type`` accepting an int in ``[low, high]`` (``high`` None: no upper bound)."""

    def parse(text: str) -> int:
        """The int in ``text``; ArgumentTypeError (a usage error, exit 2) otherwise."""
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a checkpoint over the OpenAI and Anthropic APIs")
    p.add_argument("--model", type=Path, default=None,
                   help="HF checkpoint directory (default: the embedded tiny qwen3_next model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=_int_at_least(0, 65535), default=8000,
                   help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--served-model-name", default=None,
                   help="name listed by /v1/models (default: the checkpoint folder name)")
    p.add_argument("--max-output-tokens", type=_int_at_least(1), default=4096,
                   help="server cap on generated tokens per request; larger requests are clamped")
    p.add_argument("--max-model-len", type=_int_at_least(2), default=None,
                   help="context length in tokens (default: the config's max_position_embeddings)")
    p.add_argument("--api-key", default=None, help="require this key (Bearer or x-api-key)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype (default float32)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _add_make_tiny(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("make-tiny", help="write a seeded-random checkpoint in the HF layout")
    p.add_argument("--arch", choices=["qwen3_moe", "qwen3_next"], required=True)
    p.add_argument("--preset", choices=["tiny", "small"], default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("out_dir", type=Path)


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of every ``freetoken`` sub-command."""
    parser = argparse.ArgumentParser(prog="freetoken", description="FreeToken MoE serving engine")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub)
    _add_make_tiny(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``freetoken`` console script; returns the process exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from freetoken.launch import serve

        return serve(args)
    if args.command == "make-tiny":
        from freetoken.models.tiny import make_tiny

        out = make_tiny(args.arch, args.preset, args.out_dir, seed=args.seed)
        print(f"wrote {args.arch} {args.preset} checkpoint to {out}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
