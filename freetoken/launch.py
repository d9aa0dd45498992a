"""``freetoken serve``: load a checkpoint, report progress, and run the HTTP server."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

ENDPOINTS = (
    ("POST", "/v1/chat/completions", "OpenAI chat"),
    ("POST", "/v1/completions", "OpenAI completions"),
    ("GET", "/v1/models", "OpenAI model list"),
    ("POST", "/v1/messages", "Anthropic messages"),
    ("POST", "/v1/messages/count_tokens", "Anthropic token count"),
    ("GET", "/health", "health check"),
)


def _say(message: str) -> None:
    print(f"[freetoken] {message}", flush=True)


def resolve_model(model: Path | None) -> Path:
    """The checkpoint directory to serve; generates the embedded tiny model when ``model`` is None.

    Raises:
        FileNotFoundError: ``model`` has no ``config.json``.
    """
    if model is None:
        from freetoken.models.tiny import default_model_path

        _say("no --model given: using the embedded tiny qwen3_next checkpoint")
        return default_model_path(progress=_say)
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"{model} is not a checkpoint directory (no config.json)")
    return model


def serve(args: argparse.Namespace) -> int:
    """Run the server until interrupted; returns the exit status.

    Prints load progress, then the model, the listen address and the API endpoints.
    """
    import torch
    import uvicorn

    from freetoken.engine.async_engine import AsyncEngine
    from freetoken.server.app import create_app
    from freetoken.server.config import ServerConfig

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        path = resolve_model(args.model)
    except FileNotFoundError as exc:
        _say(f"error: {exc}")
        return 2
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    started = time.perf_counter()
    _say(f"loading {path} ({args.dtype}, cpu)")
    engine = AsyncEngine.from_pretrained(path, dtype=dtype, device="cpu",
                                         max_model_len=args.max_model_len, progress=_say)
    info = engine.info
    name = args.served_model_name or path.name
    _say(f"loaded {info.model_type} in {time.perf_counter() - started:.1f}s: "
         f"vocab {info.vocab_size}, context {info.max_model_len} tokens")
    config = ServerConfig(served_model_name=name, max_output_tokens=args.max_output_tokens,
                          api_key=args.api_key)
    app = create_app(engine, config)
    base = f"http://{args.host}:{args.port}"
    _say(f"model '{name}' listening on {base}")
    for method, route, what in ENDPOINTS:
        _say(f"  {method:4} {base}{route}  ({what})")
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        close = getattr(engine, "shutdown", None)
        if close is not None:
            close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    from freetoken.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
