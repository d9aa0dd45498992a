"""The ``freetoken`` command line: ``serve``, ``make-tiny``, ``convert``, ``ctl`` and
``launch``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def int_at_least(low: int, high: int | None = None):
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
    p.add_argument("--port", type=int_at_least(0, 65535), default=8000,
                   help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--served-model-name", default=None,
                   help="name listed by /v1/models (default: the checkpoint folder name)")
    p.add_argument("--max-output-tokens", type=int_at_least(1), default=4096,
                   help="server cap on generated tokens per request; larger requests are clamped")
    p.add_argument("--max-model-len", type=int_at_least(2), default=None,
                   help="context length in tokens (default: the config's max_position_embeddings)")
    p.add_argument("--api-key", default=None, help="require this key (Bearer or x-api-key)")
    p.add_argument("--session-idle-timeout", type=int_at_least(1), default=3600, metavar="S",
                   help="seconds after which an idle harness session expires (default 3600)")
    p.add_argument("--max-sessions", type=int_at_least(1), default=1024,
                   help="most harness sessions kept (least recently used dropped; default 1024)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="compute dtype; auto (default): the checkpoint's own (config.json "
                        "torch_dtype: bfloat16 for bf16 and fp16 checkpoints, else float32); "
                        "float32 for exact parity with transformers")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _add_cache_options(p)
    _add_moe_options(p)


def _anchor_policy(text: str):
    """argparse ``type`` for ``--anchors``: a comma list of block kinds, ``all`` or ``none``."""
    from freetoken.prefix.anchors import AnchorPolicy

    try:
        return AnchorPolicy.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_cache_options(p: argparse.ArgumentParser) -> None:
    from freetoken.prefix.defaults import (
        DEFAULT_CHECKPOINT_SLOTS,
        DEFAULT_MAX_RUNNING_REQUESTS,
        DEFAULT_PAGE_SIZE,
    )

    g = p.add_argument_group("batching and prefix reuse (paged KV, radix tree, recurrent-state "
                             "checkpoints at semantic anchors)")
    g.add_argument("--max-running-requests", type=int_at_least(1, 1024),
                   default=DEFAULT_MAX_RUNNING_REQUESTS, metavar="N",
                   help=f"requests batched concurrently (default {DEFAULT_MAX_RUNNING_REQUESTS})")
    g.add_argument("--page-size", type=int_at_least(1, 4096), default=DEFAULT_PAGE_SIZE,
                   metavar="TOKENS", help=f"tokens per KV page (default {DEFAULT_PAGE_SIZE})")
    g.add_argument("--kv-cache-bytes", type=_size, default=None, metavar="SIZE",
                   help="KV page pool size, taken as given (e.g. 8GiB; requests longer than the "
                        "pool are refused; default: max-running-requests full-length sequences "
                        "within a quarter of the device memory left after the weights and a "
                        "reserve (the memory plan printed at start), at least one sequence; "
                        "refused at start when it does not fit)")
    g.add_argument("--max-num-batched-tokens", type=int_at_least(1), default=2048,
                   metavar="TOKENS", help="token budget of one engine step: the longest prefill "
                                          "chunk (default 2048)")
    g.add_argument("--state-checkpoint-slots", type=int_at_least(0),
                   default=DEFAULT_CHECKPOINT_SLOTS, metavar="N",
                   help="device-tier recurrent-state checkpoint slots "
                        f"(default {DEFAULT_CHECKPOINT_SLOTS})")
    g.add_argument("--state-checkpoint-bytes", type=_size_or_zero, default=None, metavar="SIZE",
                   help="host-tier byte budget for recurrent-state checkpoints (default a quarter "
                        "of the host memory left after the weights and a reserve, used as "
                        "needed, shrunk while host memory is below the plan's reserve; refused at "
                        "start when it does not fit; 0 keeps only the device slots)")
    g.add_argument("--anchors", type=_anchor_policy, default=None, metavar="KINDS",
                   help="block kinds that get checkpoints: comma list of turn_start, "
                        "thinking_start, tool_call_start, tool_output_start, generation_start, "
                        "generation_end, or all / none (default turn_start,generation_start,"
                        "generation_end; on hybrid models `none` means no reuse at all)")
    g.add_argument("--no-prefix-reuse", action="store_true",
                   help="compute every request from its first token (no radix-tree reuse)")


def _add_moe_options(p: argparse.ArgumentParser) -> None:
    from freetoken.offload.control import MOE_BACKENDS
    from freetoken.offload.moe_config import CPU_ACTIVATION_CHOICES, EXPERT_FORMATS, POLICIES

    g = p.add_argument_group("MoE offload (routed experts in host memory, a device expert cache)")
    g.add_argument("--device", default="cpu",
                   help="compute device: cpu (default) or cuda[:i]")
    g.add_argument("--moe-backend", choices=MOE_BACKENDS, default="auto",
                   help="resident: all experts on the device; offload: every cache miss filled; "
                        "cpu: every miss run on the CPU kernel; hybrid: the q* split; auto "
                        "(default): resident when the model fits the device, else hybrid")
    g.add_argument("--moe-cache-slots", default=None, metavar="SIZE", type=_cache_spec,
                   help="expert cache size: slots (96), a fraction of all experts (0.25) or bytes "
                        "(2GiB); default 25%% on cpu, free memory less a reserve on cuda")
    g.add_argument("--moe-expert-format", choices=EXPERT_FORMATS, default="dense",
                   help="host expert banks (and a cpu device's resident experts): dense "
                        "(default; bf16 or fp32, or as stored for MXFP4 / NVFP4 / FP8 "
                        "releases), or 4-bit mxfp4 / q4g, quantised at load (H and I must be "
                        "multiples of 32)")
    g.add_argument("--moe-cpu-activations", choices=CPU_ACTIVATION_CHOICES, default="auto",
                   help="activations of the CPU expert kernel (the cpu and hybrid backends, and "
                        "4-bit resident experts on a cpu device): auto (default: q8 for 4-bit "
                        "experts in a bfloat16 model, as llama.cpp does, bf16 for FP8 experts "
                        "in a bfloat16 model, else fp32), fp32 (exact), q8 (int8 per block of "
                        "32, faster, ~1e-2 relative error per MoE layer; needs "
                        "--moe-expert-format mxfp4 or q4g) or bf16 (rounded to bf16, vdpbf16ps "
                        "on AVX512_BF16 CPUs, ~3e-3 relative error per MoE layer; needs bf16 "
                        "dense banks or FP8 experts)")
    g.add_argument("--moe-memory-floor", default=None, metavar="SIZE",
                   help="keep SIZE (with a unit, e.g. 2GiB) of device memory free: every 16 engine "
                        "steps the expert cache shrinks when free memory is below SIZE and regrows "
                        "toward its requested size (load or `ctl memory`) when free memory exceeds "
                        "SIZE plus one slot plus 10%% of SIZE; the floor wins over a manual resize "
                        "(CUDA: driver free memory; CPU device: MemAvailable; offload, cpu or "
                        "hybrid backends). Default: no watcher")
    g.add_argument("--moe-policy", choices=POLICIES, default="lru",
                   help="expert cache eviction policy (default lru)")
    g.add_argument("--moe-profile", type=Path, default=None, metavar="FILE",
                   help="B_P/B_H profile from `freetoken profile` (default: the stored profile of "
                        "this model and device, measured at start-up when missing)")
    g.add_argument("--moe-log-every", type=int_at_least(0), default=0, metavar="STEPS",
                   help="log an expert-cache summary every STEPS engine steps (0: never)")
    g.add_argument("--record-routing", type=Path, default=None, metavar="FILE",
                   help="record every MoE layer's top-k expert ids to FILE (.npz, the format of "
                        "shared/routing) for policy replay; written when the server stops")


def _cache_spec(text: str) -> str:
    """argparse ``type`` for ``--moe-cache-slots``: checked now, kept as text."""
    from freetoken.offload.moe_config import parse_cache_spec

    try:
        parse_cache_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _add_make_tiny(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("make-tiny", help="write a seeded-random checkpoint in the HF layout")
    from freetoken.models.tiny_presets import ARCHES

    p.add_argument("--arch", choices=list(ARCHES), required=True)
    p.add_argument("--preset", choices=["tiny", "small"], default="tiny")
    p.add_argument("--expert-format", choices=["mxfp4", "bf16"], default=None,
                   help="gpt_oss experts: mxfp4 (default, as released) or the bf16 layout")
    p.add_argument("--weights", choices=["bf16", "fp8", "nvfp4"], default="bf16",
                   help="fp8: projection weights FP8 block-quantised (128 x 128), as the "
                        "official -FP8 releases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("out_dir", type=Path)


def _add_convert(sub: argparse._SubParsersAction) -> None:
    what = ("write a packed checkpoint (experts as host banks) that `serve --model DST` loads "
            "with parallel direct reads")
    p = sub.add_parser("convert", help=what, description=what.capitalize() + ".")
    p.add_argument("src", type=Path, help="HF checkpoint directory (safetensors)")
    p.add_argument("dst", type=Path, help="new or empty directory for the packed checkpoint")


def _run_convert(args: argparse.Namespace) -> int:
    from freetoken.packed.convert import convert

    def say(message: str) -> None:
        print(f"[freetoken] {message}", flush=True)

    try:
        manifest = convert(args.src, args.dst, say=say)
    except (FileNotFoundError, ValueError) as exc:
        say(f"error: {exc}")
        return 2
    except OSError as exc:
        say(f"error: cannot write {args.dst}: {exc.strerror or exc}")
        return 2
    except Exception as exc:  # noqa: BLE001 - e.g. safetensors' own error on a full disk
        say(f"error: cannot write {args.dst}: {exc}")
        return 2
    except KeyboardInterrupt:
        say(f"interrupted: nothing was left in {args.dst}")
        return 130
    fmt = manifest.dtype if manifest.expert_format == "dense" else manifest.expert_format
    say(f"wrote packed checkpoint {args.dst}: {manifest.num_layers} MoE layers x "
        f"{manifest.num_experts} experts in {fmt}, {manifest.nbytes / 1e9:.2f} GB of banks")
    return 0


def _add_profile(sub: argparse._SubParsersAction) -> None:
    from freetoken.profile_cli import add_profile

    add_profile(sub)


def _size(text: str) -> int:
    """argparse ``type`` for a byte size (``2GiB``, ``512MiB``, ``1048576``)."""
    from freetoken.offload.control import parse_bytes

    try:
        return parse_bytes(text, require_unit=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size_or_zero(text: str) -> int:
    """:func:`_size` that also takes zero (``0``, ``0B``, ``0GiB``: the tier is off)."""
    import re

    if re.fullmatch(r"\s*0+(\.0*)?\s*([KMGT]i?B|B)?\s*", text, flags=re.IGNORECASE):
        return 0
    return _size(text)


def _add_ctl(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ctl", help="inspect or control a running server")
    ctl = p.add_subparsers(dest="ctl_command", required=True)
    memory = ctl.add_parser("memory", help="show the expert cache, or resize it with --expert-cache")
    memory.add_argument("--expert-cache", type=_size, default=None, metavar="SIZE",
                        help="resize the expert cache now to SIZE (e.g. 2GiB, 1.5GB, 512MiB)")
    metrics = ctl.add_parser("metrics", help="print the server's Prometheus /metrics page")
    for c in (memory, metrics):
        c.add_argument("--server", default=None,
                       help="server URL (default $FREETOKEN_URL or http://127.0.0.1:8000)")
        c.add_argument("--api-key", default=None,
                       help="the server's API key (default $FREETOKEN_API_KEY)")


def _add_launch(sub: argparse._SubParsersAction) -> None:
    from freetoken.agents.launch import add_launch_parser

    add_launch_parser(sub)


_LIGHT_COMMANDS = {"ctl": _add_ctl, "launch": _add_launch}
_VERSION_FLAGS = ("--version", "-V")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argparse tree of every ``freetoken`` sub-command, or of just ``command`` when it is
    one of the light ones (``ctl``, ``launch``, or just ``--version``): the others read their defaults from modules that
    import torch, which costs seconds of start-up."""
    from freetoken import __version__

    parser = argparse.ArgumentParser(prog="freetoken", description="FreeToken MoE serving engine")
    parser.add_argument(*_VERSION_FLAGS, action="version", version=f"freetoken {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    if command in _VERSION_FLAGS:  # argparse prints the version and exits before the sub-command
        return parser
    if command in _LIGHT_COMMANDS:
        _LIGHT_COMMANDS[command](sub)
        return parser
    _add_serve(sub)
    _add_make_tiny(sub)
    _add_convert(sub)
    _add_ctl(sub)
    _add_profile(sub)
    _add_launch(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``freetoken`` console script; returns the process exit status."""
    from freetoken.agents.launch import split_agent_args

    argv, agent_args = split_agent_args(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    if args.command == "launch":
        from freetoken.agents.launch import run_launch

        return run_launch(args, agent_args)
    if args.command == "serve":
        from freetoken.launch import serve

        return serve(args)
    if args.command == "convert":
        return _run_convert(args)
    if args.command == "profile":
        from freetoken.profile_cli import run_profile

        return run_profile(args)
    if args.command == "ctl":
        from freetoken.ctl import run_ctl

        return run_ctl(args)
    if args.command == "make-tiny":
        from freetoken.models.tiny import make_tiny

        try:
            out = make_tiny(args.arch, args.preset, args.out_dir, seed=args.seed,
                            weights=args.weights, expert_format=args.expert_format)
        except OSError as exc:
            print(f"error: cannot write {args.out_dir}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.arch} {args.preset} checkpoint to {out}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
