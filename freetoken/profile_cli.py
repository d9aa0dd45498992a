"""``freetoken profile``: measure the offloaded MoE runtime's B_P and B_H and store them as JSON.

See :mod:`freetoken.offload.profile` for what is measured and how.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_profile(sub: argparse._SubParsersAction) -> None:
    """Register the ``profile`` sub-command on ``sub``."""
    p = sub.add_parser("profile", help="measure expert copy (B_P) and CPU kernel (B_H) bandwidths")
    p.add_argument("--model", type=Path, default=None,
                   help="HF checkpoint directory (default: the embedded tiny qwen3_next model)")
    p.add_argument("--device", default=None,
                   help="device of the expert cache: cpu or cuda[:i] (default: cuda when "
                        "available, else cpu)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype as for serve (default float32); the banks are bf16 when "
                        "computing in bf16 or when the checkpoint stores bf16 experts, else fp32")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON file to write (default: the profile cache under the cache dir)")
    p.add_argument("--seconds", type=float, default=2.0,
                   help="time budget of the timed loops in seconds (default 2)")


def run_profile(args: argparse.Namespace) -> int:
    """Measure, print both bandwidths and their ratio, store the JSON; returns the exit status
    (0, or 2 with a message on stderr for a bad model path, device or budget)."""
    import torch

    from freetoken.models.config import ModelConfig
    from freetoken.offload.loading import planned_bank_dtype
    from freetoken.offload.profile import (
        bank_dtype_for,
        default_profile_path,
        measure_profile,
        save_profile,
    )

    if args.model is None:
        from freetoken.models.tiny import default_model_path

        args.model = default_model_path(lambda msg: print(msg, file=sys.stderr))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        try:
            bank_dtype = planned_bank_dtype(args.model, args.dtype)
        except FileNotFoundError:  # a config without weights: shapes only, default bank dtype
            if not (Path(args.model) / "config.json").is_file():
                raise
            bank_dtype = bank_dtype_for(args.dtype)
        config = ModelConfig.from_file(args.model)
        profile = measure_profile(config, device=device, bank_dtype=bank_dtype,
                                  seconds=args.seconds, model=str(Path(args.model).resolve()))
        out = args.out or default_profile_path(args.model, device, bank_dtype)
        save_profile(profile, out)
    except (OSError, ValueError) as exc:
        print(f"freetoken profile: error: {exc}", file=sys.stderr)
        return 2
    mib = profile.expert_bytes / 2**20
    print(f"model {profile.model}: H={profile.hidden} I={profile.intermediate}, "
          f"expert {mib:.2f} MiB at {bank_dtype}")
    print(f"B_P  host bank -> {device} pool copy   {profile.bandwidth_p_gbps:8.2f} GB/s")
    print(f"B_H  CPU expert kernel ({profile.cpu_threads} threads) "
          f"{profile.bandwidth_h_gbps:8.2f} GB/s"
          + (f"  (measured on {profile.kernel_dtype} banks: the kernel rejects {bank_dtype})"
             if profile.kernel_dtype != bank_dtype else ""))
    print(f"B_P / B_H = {profile.ratio:.3f}")
    print(f"wrote {out}")
    return 0
