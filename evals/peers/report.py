"""Assemble ``report.md`` of a ``compare_llamacpp.sh`` run (project venv).

Usage::

    python evals/peers/report.py --out DIR --workloads "W1 W2" [settings flags written into it]

Reads ``DIR/<W>-freetoken`` and ``DIR/<W>-llamacpp`` (``evals/run.py`` folders), ``DIR/<W>/
compare.md`` (``evals/compare.py``) and ``DIR/parity.md``. Writes ``DIR/report.md`` and
``DIR/report.json`` with, per workload, the ratios llama.cpp / FreeToken of mean decode tok/s
(above 1: llama.cpp decodes faster) and of mean TTFT (above 1: llama.cpp answers later), plus a
per-turn check that both engines were sent prompts of the same token length. Each row names its
traces source (real / synthetic); a workload whose two runs are not comparable
(``evals/replay/comparison.not_comparable``: different traces, protocol, turn count, request
options or planned turns, a failed turn, an interruption, a warm start against a cold one) gets
no ratios and says why.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from evals.replay.comparison import not_comparable, ratios, traces_source  # noqa: E402
from evals.replay.report import fmt, load_run  # noqa: E402



def _compute_dtype(outtype: str) -> str:
    """What both engines compute in for a GGUF ``outtype`` (mxfp4: bf16 with MXFP4 experts)."""
    return {"f32": "float32", "mxfp4": "bf16 (MXFP4 experts)"}.get(outtype, outtype)

def workload_row(w: str, ft: dict, ll: dict) -> dict:
    """The headline numbers of one workload (both summaries from ``load_run``); the ratios are
    None when the runs are not comparable (``not_comparable`` lists why)."""
    ttft_x, decode_x = ratios(ll, ft)
    sources = sorted({traces_source(ft), traces_source(ll)})
    return {
        "workload": w, "traces": "/".join(sources), "traces_path": [ft.get("traces"),
                                                                    ll.get("traces")],
        "not_comparable": not_comparable(ll, ft), "turns": [ft["n_turns"], ll["n_turns"]],
        "failed": [ft.get("n_failed", 0), ll.get("n_failed", 0)],
        "decode_tps": [ft["decode_tps_mean"], ll["decode_tps_mean"]],
        "ttft_mean_s": [ft["ttft_mean_s"], ll["ttft_mean_s"]],
        "ttft_max_s": [ft["ttft_max_s"], ll["ttft_max_s"]],
        "reuse_ratio": [ft["reuse_ratio"], ll["reuse_ratio"]],
        "decode_ratio_llamacpp_over_freetoken": decode_x,
        "ttft_ratio_llamacpp_over_freetoken": ttft_x,
    }


def prompt_check(ft_turns: list[dict], ll_turns: list[dict]) -> str:
    """One line: how many turns had equal prompt / output token counts on both engines."""
    pairs = list(zip(ft_turns, ll_turns))
    def same(key: str) -> int:
        return sum(a.get(key) is not None and a.get(key) == b.get(key) for a, b in pairs)

    same_prompt, same_out = same("prompt_tokens"), same("output_tokens")
    diffs = [(a.get("prompt_tokens"), b.get("prompt_tokens")) for a, b in pairs
             if a.get("prompt_tokens") != b.get("prompt_tokens")]
    tail = f"; differing (FreeToken, llama.cpp): {diffs[:4]}" if diffs else ""
    return (f"prompt tokens equal on {same_prompt}/{len(pairs)} turns, output tokens equal on "
            f"{same_out}/{len(pairs)}{tail}")


def build(args: argparse.Namespace) -> tuple[str, dict]:
    """The markdown report and its JSON twin."""
    out = Path(args.out)
    rows, sections = [], []
    for w in args.workloads.split():
        try:
            ft, ft_turns = load_run(out / f"{w}-freetoken")
            ll, ll_turns = load_run(out / f"{w}-llamacpp")
        except (FileNotFoundError, ValueError) as exc:
            sections.append(f"### {w}\n\nmissing run: {exc}\n")
            continue
        row = workload_row(w, ft, ll)
        row["prompt_check"] = prompt_check(ft_turns, ll_turns)
        row["load_average"] = {side: _load(out / "log" / f"{w}-{side}.load")
                               for side in ("freetoken", "llamacpp")}
        rows.append(row)
        cmp_md = out / w / "compare.md"
        table = cmp_md.read_text(encoding="utf-8") if cmp_md.is_file() else "(compare.py failed)\n"
        loads = "; ".join(f"{side}: {v}" for side, v in row["load_average"].items())
        sections.append(f"### {w}\n\n{table.split(chr(10), 2)[-1].strip()}\n\n- {row['prompt_check']}\n"
                        f"- load average (1/5/15 min) at start / end of each run: {loads}\n")
    stamp = Path(args.build_stamp) if args.build_stamp else None
    build_s = stamp.read_text().strip() if stamp and stamp.is_file() else "unknown"
    head = ["| workload | traces | turns | FreeToken decode tok/s | llama.cpp decode tok/s | "
            "decode ratio (llama.cpp / FreeToken) | FreeToken mean TTFT (s) | llama.cpp mean "
            "TTFT (s) | TTFT ratio (llama.cpp / FreeToken) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        note = f" (not comparable: {'; '.join(r['not_comparable'])})" if r["not_comparable"] else ""
        head.append(f"| {r['workload']}{note} | {r['traces']} | {r['turns'][0]} | "
                    f"{fmt(r['decode_tps'][0], 1)} | {fmt(r['decode_tps'][1], 1)} | "
                    f"{_blank(r['decode_ratio_llamacpp_over_freetoken'])} | "
                    f"{fmt(r['ttft_mean_s'][0])} | {fmt(r['ttft_mean_s'][1])} | "
                    f"{_blank(r['ttft_ratio_llamacpp_over_freetoken'])} |")
    traces = _traces_line(args.traces, rows)
    parity = (out / "parity.md").read_text(encoding="utf-8") if (out / "parity.md").is_file() else ""
    md = "\n".join([
        "# FreeToken vs llama.cpp (llama-cpp-python server), identical weights",
        "",
        f"- model: FreeToken `small` {getattr(args, 'arch', 'qwen3_moe')} (`{args.model_dir}`), "
        f"GGUF `{args.gguf}` "
        f"({args.outtype}; both engines compute in {_compute_dtype(args.outtype)})",
        f"- machine: {platform.machine()}, {_cpu_count()} CPUs, python {platform.python_version()}; "
        f"threads {args.threads} on both; context {args.n_ctx} tokens",
        f"- llama-cpp-python 0.3.36 venv `{args.peer_python}` ({build_s})",
        f"- replay: `evals/run.py --limit-turns {args.limit_turns} --w1-max-tokens "
        f"{args.w1_max_tokens}`, ignore_eos on both (llama.cpp: EOG ids banned by logit_bias), "
        "FreeToken first then llama.cpp per workload, sequential (concurrency 1)",
        traces,
        "",
        "## Headline",
        "",
        *head,
        "",
        "## Conversion proof (greedy decode, same token ids)",
        "",
        parity.strip(),
        "",
        "## Per workload (evals/compare.py, baseline FreeToken)",
        "",
        *sections,
        "## Fairness notes",
        "",
        "- Same weights and dtype, same thread count, same context limit; both servers run on the "
        "same machine, one request at a time; other load on the machine is not controlled "
        "(load averages per run are listed per workload). Observed while building this recipe: "
        "with other processes busy on the 2 cores, llama.cpp's decode fell from ~25 to 1-7 "
        "tok/s while FreeToken's fell by under 20%, so a run with a load average above the "
        "thread count should be repeated.",
        "- FreeToken: `--max-running-requests 1` (llama-cpp-python serves one sequence) and its "
        "default prefill chunk 2048, KV cache in float32; llama.cpp: n_batch 2048, n_ubatch 512, "
        f"flash attention on, KV cache {args.llama_kv}, logits only for the last prompt token, "
        "no mlock.",
        "- Prefix reuse differs by design: FreeToken keeps a radix tree of earlier prompts, "
        "llama-cpp-python reuses only the previous request's longest common prefix.",
        "- With ignore_eos FreeToken keeps emitting the EOS id, llama.cpp the best non-EOG token; "
        "both decode max_tokens steps.",
        "- llama.cpp tokenises the rendered prompt itself (GGUF vocab, pre-tokenizer qwen2); the "
        "prompt-token check above shows whether both saw the same number of prompt tokens.",
        "",
    ])
    return md, {"rows": rows}


def _blank(ratio: float | None) -> str:
    """A ratio cell: two decimals, blank when there is no ratio."""
    return "" if ratio is None else f"{ratio:.2f}"


def _traces_line(given: str, rows: list[dict]) -> str:
    """The settings line naming the traces replayed; loud when they are the synthetic set."""
    sources = {r["traces"] for r in rows}
    paths = sorted({p for r in rows for p in r["traces_path"] if p and p != "synthetic"})
    if any("synthetic" in s for s in sources) or given == "synthetic":
        return ("- traces: **SYNTHETIC** (the built-in generated set, not real agent traffic; "
                "--allow-synthetic): timings on it say nothing about agent workloads")
    where = ", ".join(f"`{p}`" for p in paths) or (f"`{given}`" if given else "unknown")
    return f"- traces: real ({where})"


def _load(path: Path) -> str:
    """``"a b c -> d e f"`` from a run's ``.load`` file (start and end /proc/loadavg), or "?"."""
    if not path.is_file():
        return "?"
    return " -> ".join(line.strip() for line in path.read_text().splitlines() if line.strip())


def _cpu_count() -> int:
    import os

    return os.cpu_count() or 0


def main(argv: list[str] | None = None) -> int:
    """CLI: write report.md / report.json into ``--out``; exit 0."""
    p = argparse.ArgumentParser(description="compare_llamacpp.sh report")
    p.add_argument("--out", required=True)
    p.add_argument("--workloads", default="W1 W2")
    p.add_argument("--arch", default="qwen3_moe",
                   choices=("qwen3_moe", "qwen3_next", "qwen3_5_moe", "glm4_moe", "gpt_oss"))
    for flag in ("--gguf", "--model-dir", "--outtype", "--n-ctx", "--threads", "--limit-turns",
                 "--w1-max-tokens", "--build-stamp", "--peer-python", "--llama-kv", "--traces"):
        p.add_argument(flag, default="")
    args = p.parse_args(argv)
    md, data = build(args)
    Path(args.out, "report.md").write_text(md, encoding="utf-8")
    Path(args.out, "report.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
