"""Agent workloads against FreeToken and the real llama-server, side by side.

For each workload (default W2 W3 W4, ``--limit-turns`` 8) a fresh ``freetoken serve`` (default
flags) on the checkpoint, then a fresh llama-server (built by ``evals/peers/build_llamacpp_tools.sh``,
``--jinja`` so the checkpoint's chat template renders tools, ``-t`` all CPUs) on its GGUF in the
checkpoint's dtype (the same file ``evals/bench_engine.py`` converts), one server at a time, each
replayed by ``evals/run.py`` with the workload's harness edits; then ``evals/compare.py`` with
llama-server as the baseline. llama-server serves no Anthropic API, so W3 goes to it over the
OpenAI protocol (FreeToken keeps W3's default, Anthropic; the compare table says so). Prints, per
workload and engine, mean and worst TTFT, decode tok/s and the prompt tokens recomputed (not
reused) over all turns.

Run: ``python -m evals.replay_peers [--model DIR] [--workloads W2,W3,W4] [--limit-turns 8]
[--out DIR]`` (default model: the cached small qwen3_next preset).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from evals.bench_engine import bench_gguf, llamacpp_tools, serving

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = ("W1", "W2", "W3", "W4")


def _workloads(text: str) -> list[str]:
    names = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in names if w not in WORKLOADS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(WORKLOADS)}, "
                                         f"got {text!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None,
                    help="checkpoint (default: the cached small qwen3_next preset)")
    ap.add_argument("--workloads", type=_workloads, default="W2,W3,W4")
    ap.add_argument("--limit-turns", type=int, default=8)
    ap.add_argument("--n-ctx", type=int, default=131072, help="llama-server context (all slots)")
    ap.add_argument("--slots", type=int, default=4, help="llama-server parallel slots (-np)")
    ap.add_argument("--out", type=Path, default=REPO / "replay-out" / "peers-llama-server")
    return ap


def summary(run: Path) -> dict:
    """The comparison numbers of one ``evals/run.py`` folder (its ``summary.json``)."""
    s = json.loads((run / "summary.json").read_text())
    return {"turns": s["n_turns"], "failed": s["n_failed"], "ttft_mean_s": s["ttft_mean_s"],
            "ttft_max_s": s["ttft_max_s"], "decode_tok_s": s["decode_tps_mean"],
            "recomputed_prompt_tokens": s["prompt_tokens"] - s["reused_tokens"]}


def _replay(workload: str, cmd: list[str], url: str, out: Path, label: str,
            args: argparse.Namespace, env: dict | None = None) -> dict:
    with open(out / f"{label}-{workload}-server.log", "w") as log, serving(cmd, url, env, log):
        extra = ["--protocol", "openai"] if label == "llama-server" else []
        subprocess.run([sys.executable, str(REPO / "evals" / "run.py"), "--workload", workload,
                        "--endpoint", url, "--limit-turns", str(args.limit_turns), "--label",
                        label, "--no-progress", "--out", str(out / f"{workload}-{label}"),
                        *extra], check=False)
    return summary(out / f"{workload}-{label}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.model is None:
        from freetoken.models.tiny import cached_tiny

        args.model = cached_tiny("qwen3_next", "small", progress=print)
    config = json.loads((args.model / "config.json").read_text())
    outtype = "bf16" if config.get("torch_dtype") == "bfloat16" else "f32"
    bin_dir, gguf_python = llamacpp_tools()
    gguf = bench_gguf(args.model, gguf_python, outtype)
    args.out.mkdir(parents=True, exist_ok=True)
    ft_url, ll_url = "http://127.0.0.1:8441", "http://127.0.0.1:8442"
    results = {}
    for w in args.workloads:
        ft = _replay(w, [sys.executable, "-m", "freetoken", "serve", "--model", str(args.model),
                         "--port", "8441"], ft_url, args.out, "freetoken", args)
        ll = _replay(w, [str(bin_dir / "llama-server"), "-m", str(gguf), "--port", "8442",
                         "-t", str(os.cpu_count() or 1), "-c", str(args.n_ctx), "-np",
                         str(args.slots), "--jinja", "--no-webui"], ll_url, args.out,
                     "llama-server", args, dict(os.environ, LD_LIBRARY_PATH=str(bin_dir)))
        subprocess.run([sys.executable, str(REPO / "evals" / "compare.py"),
                        str(args.out / f"{w}-llama-server"), str(args.out / f"{w}-freetoken"),
                        "--out", str(args.out / w)], check=False, stdout=subprocess.DEVNULL)
        results[w] = {"freetoken": ft, "llama-server": ll}
    print(f"model {args.model.name} ({outtype}), {args.limit_turns} turns per workload")
    print(f"{'workload':>8} {'engine':>13} {'TTFT mean s':>12} {'TTFT max s':>11} "
          f"{'decode tok/s':>13} {'recomputed':>11} {'failed':>7}")
    for w, engines in results.items():
        for name, r in engines.items():
            print(f"{w:>8} {name:>13} {r['ttft_mean_s']:>12.2f} {r['ttft_max_s']:>11.2f} "
                  f"{r['decode_tok_s'] or 0:>13.1f} {r['recomputed_prompt_tokens']:>11} "
                  f"{r['failed']:>7}")
    (args.out / "summary.json").write_text(json.dumps({"model": str(args.model),
                                                       "workloads": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
