"""Start-up load benchmark: the packed format against a raw read of the same bytes.

For each checkpoint (the ``small`` qwen3_next preset, and a generated qwen3_moe with
``--expert-gb`` of bf16 experts, default 4), in a temporary directory deleted afterwards:

1. raw sequential read GB/s of the safetensors files and of the packed bank file (16 MiB
   ``readinto`` calls; each file's page cache dropped with ``posix_fadvise(DONTNEED)`` first);
2. ``load_model`` (bf16, ``--moe-backend cpu``: every expert in the host banks) from safetensors
   and from the packed form, each in a fresh process with the page cache dropped: seconds, GB/s
   and the ratio to the raw read of the same files; the packed banks alone (allocate the pool,
   fill it by the parallel chunk reader on small pages, as the loader does; ``_collapse_s``:
   then the background collapse into 2 MiB pages, not in the load time) as GB/s and ratio to the
   raw read of the bank file (``packed_over_raw``), and again straight into pages advised huge
   (``packed_banks_thp``: the first touch of a fresh 2 MiB page can cost more than reading
   it) and into banks whose pages were faulted in before the clock started
   (``packed_banks_touched``: the I/O path alone); ``_huge_over_pool``: the process's
   ``AnonHugePages`` at the end (after the collapse) over the pool's bytes;
3. peak RSS of each load process above its RSS before loading, against the weights it holds
   (the expert pool, plus the other weights for a whole model; safetensors' mmap of the files
   counts in its RSS).

Each figure is the median of ``--reps`` runs.

Run: ``python -m evals.bench_load [--expert-gb 4] [--json OUT] [--dir /tmp]`` (needs about
2.4 x expert-gb of free disk; checks it first). Not measured here: start to ``/health`` 200 to first
token and llama.cpp's server on the same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READ_BYTES = 16 * 2**20
LAYERS, EXPERTS, HIDDEN = 12, 64, 1024  # the small qwen3_moe preset's experts


def drop_cache(files: list[Path]) -> None:
    """Drop each file's clean pages from the page cache (``posix_fadvise(DONTNEED)``)."""
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_read(files: list[Path]) -> dict:
    """Sequential buffered read of ``files`` after dropping their cache: bytes, s, GB/s."""
    drop_cache(files)
    buffer = bytearray(READ_BYTES)
    total = 0
    started = time.perf_counter()
    for file in files:
        with open(file, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    seconds = time.perf_counter() - started
    return {"bytes": total, "seconds": round(seconds, 3), "gbps": round(total / seconds / 1e9, 3)}


def _status(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process in bytes (``VmHWM``, not ``ru_maxrss``: Linux
    carries ``ru_maxrss`` over from the forking parent's memory across ``execve``)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def child(kind: str, path: Path) -> None:
    """In a fresh process: load ``path`` (``kind`` ``model``) or only its packed banks (``banks``:
    as the loader fills them, on small pages, then collapsed in the background; ``banks_thp``:
    straight into pages advised huge, the first touch faulting 2 MiB pages in; ``touched``: into
    pages faulted in before the clock); print one JSON line with the load's seconds, the
    background collapse's (``collapse_s``, waited for after the clock stopped), RSS before /
    peak and the process's ``AnonHugePages`` at the end."""
    import torch

    from freetoken.huge_pages import anon_huge_bytes
    from freetoken.models.registry import load_model
    from freetoken.offload.backend import MoeConfig

    before = _status("VmRSS")
    started = time.perf_counter()
    collapse = None
    if kind == "model":
        model = load_model(path, dtype=torch.bfloat16, moe=MoeConfig(backend="cpu"))
        pool = model.moe_runtime.banks.nbytes
        weights = pool + sum(p.nbytes for p in model.parameters())
        collapse = model.bank_collapse
    else:
        from freetoken.offload.bank_pages import BackgroundCollapse, fill_on_small_pages
        from freetoken.packed.banks import bank_tensors, empty_banks, fill_banks
        from freetoken.packed.manifest import read_manifest
        from freetoken.packed.reader import ChunkReader

        manifest = read_manifest(path)
        banks = empty_banks(manifest, manifest.num_layers)
        if kind == "touched":  # the I/O path alone
            for tensor in bank_tensors(banks).values():
                tensor.view(torch.uint8).fill_(0)
            started = time.perf_counter()
        if kind == "banks":
            fill_on_small_pages((banks,))
        with ChunkReader() as reader:
            fill_banks(manifest, reader, banks, 0)
        if kind == "banks":
            collapse = BackgroundCollapse((banks,))
        pool = weights = banks.nbytes
    seconds = time.perf_counter() - started
    collapse_s = None
    if collapse is not None:
        collapse.wait()
        collapse_s = collapse.seconds
    peak = _status("VmHWM")
    print(json.dumps({"seconds": seconds, "collapse_s": collapse_s,
                      "rss_before": before, "rss_peak": peak, "pool_bytes": pool,
                      "weight_bytes": weights, "anon_huge_bytes": anon_huge_bytes()}))


def measure(kind: str, path: Path, files: list[Path]) -> dict:
    """Run :func:`child` in a fresh interpreter with ``files``' page cache dropped."""
    drop_cache(files)
    out = subprocess.run([sys.executable, "-m", "evals.bench_load", "--child", kind, str(path)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(runs: list[dict], key: str) -> float:
    return sorted(r[key] for r in runs)[len(runs) // 2]


def bench_checkpoint(label: str, src: Path, dst: Path, reps: int) -> dict:
    """Every figure of one checkpoint (``src`` safetensors, ``dst`` its packed form), each the
    median of ``reps`` runs (raw reads and loads interleaved, so drifts in the disk's speed hit
    both)."""
    st_files = sorted(src.glob("*.safetensors"))
    packed_files = sorted(dst.glob("*.safetensors")) + [dst / "experts.ftw"]
    runs: dict[str, list[dict]] = {}
    for _ in range(reps):
        for name, result in (("raw_safetensors", lambda: raw_read(st_files)),
                             ("safetensors", lambda: measure("model", src, st_files)),
                             ("raw_packed", lambda: raw_read(packed_files)),
                             ("packed", lambda: measure("model", dst, packed_files)),
                             ("raw_banks", lambda: raw_read([dst / "experts.ftw"])),
                             ("packed_banks", lambda: measure("banks", dst,
                                                              [dst / "experts.ftw"])),
                             ("packed_banks_thp", lambda: measure("banks_thp", dst,
                                                                  [dst / "experts.ftw"])),
                             ("packed_banks_touched", lambda: measure("touched", dst,
                                                                      [dst / "experts.ftw"]))):
            runs.setdefault(name, []).append(result())
    row = {"checkpoint": label, "pool_bytes": runs["packed_banks"][0]["pool_bytes"]}
    for raw in ("raw_safetensors", "raw_packed", "raw_banks"):
        row[f"{raw}_gbps"] = _median(runs[raw], "gbps")
    for name, raw in (("safetensors", "raw_safetensors"), ("packed", "raw_packed"),
                      ("packed_banks", "raw_banks"), ("packed_banks_thp", "raw_banks"),
                      ("packed_banks_touched", "raw_banks")):
        seconds = _median(runs[name], "seconds")
        gbps = runs[raw][0]["bytes"] / seconds / 1e9
        row[f"{name}_load_s"] = round(seconds, 3)
        if name in ("packed", "packed_banks"):  # then in the background, the 2 MiB pages
            row[f"{name}_collapse_s"] = round(_median(runs[name], "collapse_s"), 3)
        row[f"{name}_gbps"] = round(gbps, 3)
        row[f"{name}_over_raw"] = round(gbps / row[f"{raw}_gbps"], 3)
        last = runs[name][-1]
        grown = last["rss_peak"] - last["rss_before"]
        row[f"{name}_peak_rss_over_weights"] = round(grown / last["weight_bytes"], 3)
        # the share of the pool on 2 MiB pages at the end (the process's AnonHugePages)
        row[f"{name}_huge_over_pool"] = round(last["anon_huge_bytes"] / last["pool_bytes"], 3)
    return row


def _table(rows: list[dict]) -> None:
    keys = [k for k in rows[0] if k != "checkpoint"]
    print(f"{'':44}" + "".join(f"{r['checkpoint']:>14}" for r in rows))
    for key in keys:
        print(f"{key:44}" + "".join(f"{r[key]:>14}" for r in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--expert-gb", type=float, default=4.0,
                        help="GB of bf16 routed experts in the generated checkpoint (default 4)")
    parser.add_argument("--reps", type=int, default=3, help="runs per figure (median; default 3)")
    parser.add_argument("--skip-small", action="store_true", help="only the generated checkpoint")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the temporary checkpoints go (deleted afterwards)")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT",
                        help="write the figures (packed_over_raw: the generated checkpoint's "
                             "packed banks load / raw read of the bank file)")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return 0
    from freetoken.models.tiny import cached_tiny, make_tiny
    from freetoken.packed.convert import convert

    per_unit = LAYERS * EXPERTS * 3 * HIDDEN * 2  # bytes per unit of moe_intermediate_size
    inter = max(128, round(args.expert_gb * 1e9 / per_unit / 128) * 128)
    need = 2.4 * per_unit * inter
    free = shutil.disk_usage(args.dir).free
    if free < need:
        print(f"error: {args.dir} has {free / 1e9:.1f} GB free, the benchmark needs "
              f"{need / 1e9:.1f} GB: pass a smaller --expert-gb or another --dir", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="bench-load-", dir=args.dir))
    rows = []
    try:
        if not args.skip_small:
            small = cached_tiny("qwen3_next", "small", 0)
            convert(small, root / "small-packed")
            rows.append(bench_checkpoint("small", small, root / "small-packed", args.reps))
            shutil.rmtree(root / "small-packed")
        started = time.perf_counter()
        src = make_tiny("qwen3_moe", "small", root / "large-src",
                        config_overrides={"moe_intermediate_size": inter})
        convert(src, root / "large-packed")
        print(f"generated {per_unit * inter / 1e9:.2f} GB of experts (I = {inter}) and packed "
              f"them in {time.perf_counter() - started:.0f} s", flush=True)
        rows.append(bench_checkpoint(f"{per_unit * inter / 1e9:.1f}GB", src,
                                     root / "large-packed", args.reps))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _table(rows)
    if args.json is not None:
        body = {"rows": rows, "packed_over_raw": rows[-1]["packed_banks_over_raw"]}
        args.json.write_text(json.dumps(body, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
