"""Engine benchmark: FreeToken's server against llama.cpp's llama-server on identical weights.

Both engines serve the same checkpoint (FreeToken the safetensors with **default flags**,
llama.cpp a GGUF written by ``evals/peers/convert_gguf.py`` in the checkpoint's own dtype), both
up at once on 127.0.0.1, and each gets the same streamed ``/v1/completions`` requests (greedy,
``ignore_eos``), one request at a time, the two servers taking turns (the order alternating), so
the machine's speed drifting over minutes does not bias the ratios. Per prompt length it reports, for each engine:

* decode ms/token: (last token's arrival - first token's arrival) / (tokens - 1) of a
  ``--tokens``-token completion, the median over ``--repeats`` runs;
* prefill tok/s: prompt tokens / time to first token (the prompt is new to both engines: every
  run's prompt starts with a different token, so no prefix cache applies);

and the ratio llama.cpp / FreeToken of each (decode: ms ratio, >= 1 means FreeToken is at least
as fast; prefill: tok/s ratio FreeToken / llama.cpp). With ``--overhead`` (the default) both
engines also serve the embedded tiny qwen3_next, and FreeToken's decode ms/token there is split
into its model step alone (``forward_batch`` timed in this process) and the rest: the per-step
engine overhead (scheduler, batch build, sampler, detokenizer, streaming). Per ``--concurrency`` count c it sends c
streamed requests of ``--concurrent-prompt`` new tokens at once and reports the aggregate decode
tok/s while all of them decode (tokens arriving between the latest first token and the earliest
last one, over that span; llama-server gets c slots), its ratio FreeToken / llama.cpp and each
engine's gain over its lowest count. The prompts are random token ids of the
checkpoint's vocabulary (both engines get the ids, so tokenisers cannot differ).

llama.cpp comes from ``evals/peers/build_llamacpp_tools.sh`` (its own llama-server, built once
from the llama.cpp source in the llama-cpp-python sdist, ~20 min on 2 cores). The checkpoint
defaults to the seeded ``small`` qwen3_moe preset (``freetoken make-tiny``); ``--model`` takes any
qwen3_moe, qwen3_next, qwen3_5_moe, glm4_moe or gpt_oss checkpoint the converter maps (e.g.
``~/.cache/freetoken/models/small-qwen3_next``, ``small-qwen3_5_moe``, ``small-glm4_moe`` or
``small-gpt_oss``, llama.cpp arch ``qwen3next`` / ``qwen35moe`` / ``glm4moe`` / ``gpt-oss``; an
MXFP4 gpt_oss checkpoint keeps its MXFP4 experts in the GGUF, ``--outtype mxfp4``). Run:
``python -m evals.bench_engine [--model DIR] [--prompts 16,512,2048] [--json F]``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / "evals" / "peers"


def llamacpp_tools() -> tuple[Path, Path]:
    """(llama.cpp bin folder, python with gguf) from build_llamacpp_tools.sh."""
    out = subprocess.run(["bash", str(PEERS / "build_llamacpp_tools.sh")], check=True,
                         capture_output=True, text=True).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return Path(values["BIN"]), Path(values["GGUF_PYTHON"])


def bench_gguf(model: Path, gguf_python: Path, outtype: str) -> Path:
    digest = hashlib.sha256()
    for name in ("convert_gguf.py", "gguf_plan.py", "gguf_encode.py", "gguf_glm4_moe.py",
                 "gguf_gpt_oss.py", "mxfp4_np.py", "gguf_vocab.py",
                 "safetensors_np.py"):  # the converter
        digest.update((PEERS / name).read_bytes())
    for name in ("config.json", "freetoken_tiny.json"):
        if (model / name).exists():
            digest.update((model / name).read_bytes())
    key = f"{model.resolve()} {digest.hexdigest()}"
    cache = Path(os.environ.get("FREETOKEN_CACHE", Path.home() / ".cache" / "freetoken"))
    path = cache / "peers" / "gguf" / f"{model.name}-bench-{outtype}.gguf"
    stamp = path.with_suffix(".key")
    if not (path.exists() and stamp.exists() and stamp.read_text() == key):
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(gguf_python), str(PEERS / "convert_gguf.py"), str(model), str(path),
                        "--outtype", outtype], check=True, stdout=subprocess.DEVNULL)
        stamp.write_text(key)
    return path


def checkpoint_config(model: Path) -> dict:
    """``config.json``, with a multimodal release's ``text_config`` (qwen3_5_moe: vocab_size,
    dtype) merged over its top level and ``dtype`` also read as ``torch_dtype``."""
    config = json.loads((model / "config.json").read_text())
    config = {**config, **(config.get("text_config") or {})}
    config.setdefault("torch_dtype", config.get("dtype"))
    return config


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def _stream(url: str, prompt: list[int], tokens: int,
            arrivals: list[float] | None = None) -> tuple[float, float, int]:
    """(seconds to first token, seconds first -> last token, completion tokens); each text
    chunk's ``perf_counter`` time is appended to ``arrivals`` when given."""
    body = {"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    count = 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                first = first or now
                last = now
                if arrivals is not None:
                    arrivals.append(now)
            usage = chunk.get("usage")
            if usage:
                count = usage.get("completion_tokens", count)
    if first is None:
        raise RuntimeError("no token streamed")
    return first - t0, last - first, count


def concurrent_decode(url: str, prompts: list[list[int]], tokens: int) -> float:
    """Aggregate decode tok/s of ``len(prompts)`` streamed requests sent at once, while all of
    them decode: the tokens that arrive between the latest first token and the earliest last
    token, over that span (prefill of the later requests is outside it)."""
    arrivals: list[list[float]] = [[] for _ in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        list(pool.map(lambda i: _stream(url, prompts[i], tokens, arrivals[i]),
                      range(len(prompts))))
    start, end = max(a[0] for a in arrivals), min(a[-1] for a in arrivals)
    if end <= start:
        raise RuntimeError("the requests never decoded together; raise --tokens")
    inside = sum(start < t <= end for a in arrivals for t in a)
    return inside / (end - start)


def measure(urls: dict[str, str], args: argparse.Namespace, vocab: int) -> dict[str, dict]:
    """Per server (name -> base URL): per prompt length the median decode ms/token and prefill
    tok/s over ``args.repeats`` runs, per concurrency the median aggregate decode tok/s
    (:func:`concurrent_decode`). The servers take turns on the same prompts, the order rotating
    from one repeat to the next, so the machine's drift over minutes weighs on all alike."""
    rng = random.Random(args.seed)
    names = list(urls)
    out = {name: {"prompts": {}, "concurrency": {}} for name in names}
    for name in names:
        _stream(urls[name], [rng.randrange(vocab) for _ in range(8)], 4)  # warm-up

    def turns(i: int) -> list[str]:
        return names[i % len(names):] + names[:i % len(names)]

    for n in args.prompts:
        decode: dict[str, list[float]] = {name: [] for name in names}
        prefill: dict[str, list[float]] = {name: [] for name in names}
        for i in range(args.repeats):
            prompt = [rng.randrange(vocab) for _ in range(n)]
            for name in turns(i):
                ttft, span, count = _stream(urls[name], prompt, args.tokens)
                decode[name].append(1e3 * span / max(count - 1, 1))
                prefill[name].append(n / ttft)
        for name in names:
            out[name]["prompts"][n] = {"decode_ms": statistics.median(decode[name]),
                                       "prefill_tok_s": statistics.median(prefill[name])}
    n = args.concurrent_prompt
    for c in args.concurrency:
        rates: dict[str, list[float]] = {name: [] for name in names}
        for i in range(args.repeats):
            prompts = [[rng.randrange(vocab) for _ in range(n)] for _ in range(c)]
            for name in turns(i):
                rates[name].append(concurrent_decode(urls[name], prompts, args.tokens))
        for name in names:
            out[name]["concurrency"][c] = statistics.median(rates[name])
    return out


@contextlib.contextmanager
def serving(cmd: list[str], url: str, env: dict | None = None, log=subprocess.DEVNULL):
    """Run the server ``cmd`` until the block ends, entering once ``url`` answers /health;
    its output goes to ``log`` (a file object, or discarded)."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(url, proc)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def model_step_ms(model_dir: Path, prompt: int, steps: int) -> float:
    """Median ms of one decode step of FreeToken's model alone (``forward_batch`` of one
    sequence over a paged KV pool, the checkpoint's dtype, no engine around it): what a served
    token costs minus the engine's per-step overhead."""
    import torch

    from freetoken.models.paged import SlotTable
    from freetoken.models.registry import load_model
    from freetoken.prefix.kv_pool import KVPagePool

    config = checkpoint_config(model_dir)
    dtype = torch.bfloat16 if config.get("torch_dtype") == "bfloat16" else torch.float32
    model = load_model(model_dir, dtype=dtype)
    page = 16
    pool = KVPagePool(model.kv_layout(), num_pages=(prompt + steps + 40) // page + 1,
                      page_size=page)
    table = SlotTable([s for p in pool.alloc_pages(pool.num_pages) for s in pool.page_slots(p)])
    state = model.new_paged_state(pool, table)
    rng = random.Random(0)
    model.forward_batch([torch.tensor([rng.randrange(1000) for _ in range(prompt)])], [state])
    times = []
    for i in range(steps + 20):
        ids = [torch.tensor([rng.randrange(1000)])]
        t0 = time.perf_counter()
        model.forward_batch(ids, [state])
        if i >= 20:  # warm-up steps
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _lengths(text: str) -> list[int]:
    return [_positive(p) for p in text.split(",") if p.strip()] or [_positive("")]


def _counts(text: str) -> list[int]:
    """A comma list of positive integers, or the empty string for none."""
    return [_positive(p) for p in text.split(",") if p.strip()]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None,
                    help="qwen3_moe, qwen3_next, qwen3_5_moe, glm4_moe or gpt_oss checkpoint "
                         "(default: the cached small qwen3_moe preset)")
    ap.add_argument("--prompts", type=_lengths, default="16,512,2048",
                    help="comma list of prompt lengths")
    ap.add_argument("--tokens", type=_positive, default=64, help="completion tokens per request")
    ap.add_argument("--concurrency", type=_counts, default="1,4,8",
                    help="comma list of concurrent request counts for the aggregate decode rows "
                         "('' for none)")
    ap.add_argument("--concurrent-prompt", type=_positive, default=32,
                    help="prompt tokens of each concurrent request")
    ap.add_argument("--repeats", type=_positive, default=3, help="requests per prompt length")
    ap.add_argument("--threads", type=_positive, default=os.cpu_count() or 1,
                    help="llama.cpp threads (FreeToken picks its own)")
    ap.add_argument("--freetoken-args", default="", help="extra flags for freetoken serve")
    ap.add_argument("--overhead", action=argparse.BooleanOptionalAction, default=True,
                    help="also serve the embedded tiny qwen3_next on both engines: decode "
                         "ms/token, FreeToken's model step alone, and the rest (per-step "
                         "engine overhead)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    return ap


def serve_both(model: Path, args: argparse.Namespace) -> tuple[dict, dict, str]:
    """FreeToken's and llama-server's :func:`measure` results on ``model`` (both servers up,
    taking turns on each request), and the checkpoint dtype the GGUF keeps (``bf16``, ``f32``, or ``mxfp4``: MXFP4
    experts, the rest as stored)."""
    config = checkpoint_config(model)
    vocab = min(config["vocab_size"], 8192)  # prompt ids: ordinary tokens, never the specials
    quant = config.get("quantization_config")
    outtype = "bf16" if config.get("torch_dtype") == "bfloat16" else "f32"
    if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":
        outtype = "mxfp4"  # gpt-oss: the released MXFP4 expert bytes, the rest as stored
    bin_dir, gguf_python = llamacpp_tools()
    gguf = bench_gguf(model, gguf_python, outtype)
    slots = max([1, *args.concurrency])
    per_slot = max(args.prompts + [args.concurrent_prompt]) + args.tokens + 64
    ft_port, ll_port = 8431, 8432
    env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir))
    urls = {"ft": f"http://127.0.0.1:{ft_port}", "ll": f"http://127.0.0.1:{ll_port}"}
    with contextlib.ExitStack() as stack:
        stack.enter_context(serving([sys.executable, "-m", "freetoken", "serve", "--model",
                                     str(model), "--port", str(ft_port),
                                     *args.freetoken_args.split()], urls["ft"]))
        stack.enter_context(serving([str(bin_dir / "llama-server"), "-m", str(gguf), "--port",
                                     str(ll_port), "-t", str(args.threads), "-c",
                                     str(slots * per_slot), "-np", str(slots), "--no-webui"],
                                    urls["ll"], env))
        result = measure(urls, args, vocab)
    ft, ll = result["ft"], result["ll"]
    return ft, ll, outtype


def overhead(args: argparse.Namespace) -> dict:
    """The per-step row on the embedded tiny qwen3_next (16-token prompt): both engines' decode
    ms/token served, FreeToken's model step alone, and FreeToken's rest (engine overhead)."""
    from freetoken.models.tiny import cached_tiny

    model = cached_tiny("qwen3_next", "tiny", progress=print)
    tiny = argparse.Namespace(**{**vars(args), "prompts": [16], "concurrency": []})
    ft, ll, _ = serve_both(model, tiny)
    served, peer = ft["prompts"][16]["decode_ms"], ll["prompts"][16]["decode_ms"]
    step = model_step_ms(model, 16, 200)
    row = dict(model=str(model), freetoken_decode_ms=served, llamacpp_decode_ms=peer,
               ratio=peer / served, freetoken_model_step_ms=step,
               freetoken_overhead_ms=served - step)
    print(f"tiny qwen3_next, 16-token prompt: decode ms/token FreeToken {served:.2f} (model step "
          f"{step:.2f} + engine overhead {served - step:.2f}), llama.cpp {peer:.2f}, ratio "
          f"{row['ratio']:.2f}")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: not a checkpoint directory (no config.json)")
    if args.model is None:
        from freetoken.models.tiny import cached_tiny

        args.model = cached_tiny("qwen3_moe", "small", progress=print)
    ft, ll, outtype = serve_both(args.model, args)
    rows = []
    print(f"model {args.model.name} ({outtype}), {args.tokens} tokens, median of {args.repeats}; "
          f"freetoken serve {args.freetoken_args or '(defaults)'}; llama-server -t {args.threads}")
    print(f"{'prompt':>7} {'decode ms/tok FT':>17} {'llama.cpp':>10} {'ratio':>6}   "
          f"{'prefill tok/s FT':>17} {'llama.cpp':>10} {'ratio':>6}")
    for n in args.prompts:
        a, b = ft["prompts"][n], ll["prompts"][n]
        row = dict(prompt=n, freetoken_decode_ms=a["decode_ms"], llamacpp_decode_ms=b["decode_ms"],
                   decode_ratio=b["decode_ms"] / a["decode_ms"],
                   freetoken_prefill_tok_s=a["prefill_tok_s"],
                   llamacpp_prefill_tok_s=b["prefill_tok_s"],
                   prefill_ratio=a["prefill_tok_s"] / b["prefill_tok_s"])
        rows.append(row)
        print(f"{n:>7} {a['decode_ms']:>17.2f} {b['decode_ms']:>10.2f} {row['decode_ratio']:>6.2f}   "
              f"{a['prefill_tok_s']:>17.0f} {b['prefill_tok_s']:>10.0f} {row['prefill_ratio']:>6.2f}")
    concurrency = []
    if args.concurrency:
        print(f"{'concurrent':>10} {'agg decode tok/s FT':>20} {'llama.cpp':>10} {'ratio':>6}   "
              f"{'FT x single':>11} {'llama.cpp x single':>18}")
    single = {name: res["concurrency"].get(min(args.concurrency or [1]))
              for name, res in (("ft", ft), ("ll", ll))}
    for c in args.concurrency:
        a, b = ft["concurrency"][c], ll["concurrency"][c]
        row = dict(concurrency=c, freetoken_decode_tok_s=a, llamacpp_decode_tok_s=b,
                   ratio=a / b, freetoken_scaling=a / single["ft"],
                   llamacpp_scaling=b / single["ll"])
        concurrency.append(row)
        print(f"{c:>10} {a:>20.1f} {b:>10.1f} {row['ratio']:>6.2f}   "
              f"{row['freetoken_scaling']:>11.2f} {row['llamacpp_scaling']:>18.2f}")
    per_step = overhead(args) if args.overhead else None
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "rows": rows,
                                         "concurrency": concurrency, "overhead": per_step,
                                         "freetoken_args": args.freetoken_args}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
