"""llama.cpp's side of the conversion check: same ids through the GGUF, compared with FreeToken.

Usage::

    python evals/peers/parity_llamacpp.py MODEL.gguf REF.json [--out PARITY.json] [--tol 1e-3]
        [--server BIN_DIR]

``REF.json`` comes from ``ref_freetoken.py``. llama.cpp runs either through llama-cpp-python's
``Llama`` (the default; the peer venv of ``compare_llamacpp.sh``, which has ``llama_cpp``) or,
with ``--server BIN_DIR``, through llama.cpp's own ``llama-server`` from that folder (the build of
``build_llamacpp_tools.sh``; then any python with numpy will do, e.g. its ``GGUF_PYTHON``). The
server is started on a free 127.0.0.1 port with the same settings as the binding (f32 KV cache,
no flash attention, batch 512, one slot) and stopped at the end; its tokenizer is
``/tokenize`` (``add_special: false, parse_special: true``) and a step's log-softmax comes from a
``/completion`` of one token with ``n_probs`` covering the whole vocabulary. The GGUF's
architecture does not matter here (qwen3moe, qwen3next and qwen35moe all go through it).
Checks, all on identical token ids:

1. Tokenizer: llama.cpp's ``tokenize(text, add_bos=False, special=True)`` of every text and of
   every rendered chat prompt equals FreeToken's ids.
2. Logits, teacher-forced: the prompt is evaluated in one batch (prefill), then FreeToken's greedy
   tokens one at a time (decode; the server gets prompt + the first i tokens as one request each,
   reusing its cached prefix where it can); at every step llama.cpp's log-softmax is compared with
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
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


class BindingPeer:
    """llama.cpp through llama-cpp-python's ``Llama`` (one context, logits of every position)."""

    def __init__(self, gguf_path: str | Path, n_ctx: int, n_threads: int) -> None:
        from llama_cpp import Llama  # only in compare_llamacpp.sh's peer venv

        # KV cache in f32 (type 0), like FreeToken's float32 compute; llama.cpp's default is f16.
        self.llm = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=512, n_threads=n_threads,
                         n_threads_batch=n_threads, logits_all=True, verbose=False, type_k=0,
                         type_v=0)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def forced_logprobs(self, prompt: list[int], out: list[int], sampleable: int) -> Iterator:
        """Log-softmax over ``sampleable`` ids after ``prompt + out[:i]``, for i = 0, 1, ..."""
        self.llm.reset()
        self.llm.eval(prompt)
        for i in range(len(out)):
            yield _log_softmax(np.asarray(self.llm.scores[self.llm.n_tokens - 1])[:sampleable])
            if i + 1 < len(out):
                self.llm.eval([out[i]])  # teacher forcing: continue on FreeToken's token

    def close(self) -> None:
        self.llm.close()


class ServerPeer:
    """llama.cpp's own ``llama-server`` from ``bin_dir``, started here and stopped by
    :meth:`close`.

    Raises:
        FileNotFoundError: no ``llama-server`` in ``bin_dir``.
        RuntimeError: the server exited or did not answer ``/health`` within 300 s.
    """

    def __init__(self, gguf_path: str | Path, n_ctx: int, n_threads: int, bin_dir: str | Path,
                 log: Path | None = None) -> None:
        exe = Path(bin_dir) / "llama-server"
        if not exe.is_file():
            raise FileNotFoundError(f"{exe} not found (build it with build_llamacpp_tools.sh)")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, LD_LIBRARY_PATH=str(Path(bin_dir)))
        self._log = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(exe), "-m", str(gguf_path), "--host", "127.0.0.1", "--port", str(port),
             "-c", str(n_ctx), "-b", "512", "-ub", "512", "-t", str(n_threads),
             "-tb", str(n_threads), "-np", "1", "-ctk", "f32", "-ctv", "f32", "-fa", "off",
             "--no-webui"], stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.time() > deadline:
                self.close()
                raise RuntimeError("llama-server did not answer /health within 300 s")
            time.sleep(0.3)
        # The server drops a token's probabilities when its text is an incomplete UTF-8
        # sequence, so each step samples this single-byte token instead (a logit bias acts in
        # the sampler chain; the reported log-softmax is of the model's raw logits).
        self.sampled_token = self.tokenize("a")[0]

    def _post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def tokenize(self, text: str) -> list[int]:
        body = {"content": text, "add_special": False, "parse_special": True}
        return self._post("/tokenize", body)["tokens"]

    def forced_logprobs(self, prompt: list[int], out: list[int], sampleable: int) -> Iterator:
        """As :meth:`BindingPeer.forced_logprobs`: one one-token completion per step, with the
        pre-sampling log-softmax of every vocabulary id (``n_probs`` above the vocabulary)."""
        for i in range(len(out)):
            body = {"prompt": prompt + out[:i], "n_predict": 1, "temperature": 0,
                    "n_probs": 1 << 20, "post_sampling_probs": False, "cache_prompt": True,
                    "logit_bias": [[self.sampled_token, 1000.0]]}
            top = self._post("/completion", body)["completion_probabilities"][0]["top_logprobs"]
            full = np.full(max(sampleable, max(t["id"] for t in top) + 1), -np.inf)
            full[[t["id"] for t in top]] = [t["logprob"] for t in top]
            yield _log_softmax(full[:sampleable])  # renormalised over the tokenizer's ids

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()


def compare(gguf_path: str | Path, ref: dict, n_threads: int = 2,
            server_bin: str | Path | None = None, server_log: Path | None = None) -> dict:
    """Run the three checks of the module docstring.

    Args:
        gguf_path: the converted model.
        ref: the parsed ``ref_freetoken.py`` JSON.
        n_threads: llama.cpp CPU threads.
        server_bin: folder with ``llama-server`` to use instead of llama-cpp-python.
        server_log: where the server's output goes (discarded when None).

    Returns:
        ``{"gguf", "peer", "texts": {"equal", "total", "mismatches"}, "chats":
        [{"prompt_tokens", "prompt_ids_equal", "n_tokens", "greedy_agree", "first_divergence":
        None | {"step", "freetoken", "llamacpp", "ft_top1_top2_gap"},
        "first_token_max_abs_logprob_diff", "max_abs_logprob_diff"}], "max_abs_logprob_diff",
        "first_token_max_abs_logprob_diff"}``.
    """
    longest = max(len(c["prompt_ids"]) + len(c["output_ids"]) for c in ref["chats"])
    n_ctx = max(512, longest + 8)
    if server_bin is None:
        peer = BindingPeer(gguf_path, n_ctx, n_threads)
    else:
        peer = ServerPeer(gguf_path, n_ctx, n_threads, server_bin, server_log)
    try:
        mismatches = []
        for item in ref["texts"]:
            ids = peer.tokenize(item["text"])
            if ids != item["ids"]:
                mismatches.append({"text": item["text"], "freetoken": item["ids"], "llamacpp": ids})
        chats = []
        for chat in ref["chats"]:
            equal = peer.tokenize(chat["prompt"]) == chat["prompt_ids"]
            logps = peer.forced_logprobs(chat["prompt_ids"], chat["output_ids"],
                                         ref["sampleable_vocab"])
            chats.append(_compare_chat(logps, chat, equal))
    finally:
        peer.close()
    return {
        "gguf": str(gguf_path),
        "peer": "llama-cpp-python" if server_bin is None else "llama-server",
        "texts": {"equal": len(ref["texts"]) - len(mismatches), "total": len(ref["texts"]),
                  "mismatches": mismatches},
        "chats": chats,
        "max_abs_logprob_diff": max(c["max_abs_logprob_diff"] for c in chats),
        "first_token_max_abs_logprob_diff": max(c["first_token_max_abs_logprob_diff"]
                                                for c in chats),
    }


def _compare_chat(logps: Iterator, chat: dict, prompt_equal: bool) -> dict:
    prompt, out, steps = chat["prompt_ids"], chat["output_ids"], chat["steps"]
    diffs: list[float] = []
    agree, divergence = 0, None
    for i, (step, logp) in enumerate(zip(steps, logps)):
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
    p.add_argument("--server", metavar="BIN_DIR",
                   help="run llama.cpp's llama-server from BIN_DIR instead of llama-cpp-python")
    p.add_argument("--server-log", type=Path, help="write llama-server's output here")
    args = p.parse_args(argv)
    ref = json.loads(Path(args.ref).read_text(encoding="utf-8"))
    result = compare(args.gguf, ref, args.threads, args.server, args.server_log)
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
