"""``freetoken serve``: bind, run the HTTP server at once, and load the checkpoint in the
background while ``/health`` reports the progress.

Everything up to the first ``/health`` answer is torch-free on a CPU device (flag checks, the
checkpoint's config and packed manifest, the memory plan, the loading server): torch is first
imported by the loader thread, so the port answers within a fraction of a second of the start.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from freetoken.serve_load import TEST_LOAD_DELAY_ENV  # noqa: F401 - re-exported for tests

if TYPE_CHECKING:
    from freetoken.offload.moe_config import MoeConfig
    from freetoken.packed.manifest import PackedManifest

ENDPOINTS = (
    ("POST", "/v1/chat/completions", "OpenAI chat"),
    ("POST", "/v1/completions", "OpenAI completions"),
    ("GET", "/v1/models", "OpenAI model list"),
    ("POST", "/v1/responses", "OpenAI responses"),
    ("GET", "/v1/responses/{id}", "a stored response"),
    ("DELETE", "/v1/responses/{id}", "forget a stored response"),
    ("GET", "/v1/responses/{id}/input_items", "a stored response's input items"),
    ("POST", "/v1/messages", "Anthropic messages"),
    ("POST", "/v1/messages/count_tokens", "Anthropic token count"),
    ("GET", "/health", "health check"),
    ("GET", "/metrics", "Prometheus metrics"),
    ("GET", "/v1/freetoken/memory", "expert cache size and the memory plan"),
    ("POST", "/v1/freetoken/memory", "resize the expert cache"),
    ("GET", "/v1/freetoken/status", "the engine at a glance (JSON behind /ui)"),
    ("GET", "/ui/", "the operator page: live charts, memory, sessions, chat"),
    ("POST", "/v1/sessions", "create a harness session"),
    ("GET", "/v1/sessions", "harness sessions and their prefix reuse"),
    ("GET", "/v1/sessions/{id}", "one harness session"),
    ("DELETE", "/v1/sessions/{id}", "forget a harness session"),
    ("GET", "/openapi.json", "OpenAPI schema"),
)


def _say(message: str) -> None:
    print(f"[freetoken] {message}", flush=True)


def resolve_model(model: Path | None) -> Path:
    """The checkpoint directory to serve; generates the embedded tiny model when ``model`` is None.

    Raises:
        FileNotFoundError: ``model`` has no ``config.json``.
    """
    if model is None:
        from freetoken.models.tiny_cache import cached

        _say("no --model given: using the embedded tiny qwen3_next checkpoint")
        found = cached("qwen3_next")  # torch-free; generating it needs torch
        if found is not None:
            return found
        from freetoken.models.tiny import default_model_path

        return default_model_path(progress=_say)
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"{model} is not a checkpoint directory (no config.json)")
    return model


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` (not yet listening; uvicorn calls ``listen``).

    Binding before the model loads reserves the port and turns "address already in use" into an
    immediate, clear error instead of one printed after a long load and a false "listening" line.

    Args:
        host: bind address (IPv4, IPv6 or a resolvable name).
        port: TCP port, 0 for any free one.

    Raises:
        OSError: the address cannot be resolved or bound (in use, not local, no permission).
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def base_url(host: str, port: int) -> str:
    """``http://host:port`` (IPv6 literals in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


SHUTDOWN_MESSAGE = "the server is shutting down"


def _interrupt(signum, frame) -> None:
    """SIGINT / SIGTERM handler (uvicorn re-raises the signal after its graceful shutdown): stop
    like Ctrl-C, so the engine shuts down, recordings are saved and ``stopped`` is printed, also
    where SIGINT was ignored at start (a background job)."""
    raise KeyboardInterrupt


def _uvicorn_server(config, loaded_engine):
    """A ``uvicorn.Server`` that, at the first stop signal, ends every open stream with an error
    (``stop_streams`` of ``loaded_engine()``, the engine once loaded, else None) before its
    graceful shutdown waits for the connections to close."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                stop = getattr(loaded_engine(), "stop_streams", None)
                if stop is not None:
                    stop(SHUTDOWN_MESSAGE)
            super().handle_exit(sig, frame)

    return Server(config)


def checkpoint_compute_dtype(path: Path) -> str:
    """``--dtype auto``: ``"bfloat16"`` when the checkpoint's ``config.json`` says it is stored in
    bf16 or fp16 (``torch_dtype`` / ``dtype``, at the top level or, for a multimodal release, in
    ``text_config``; fp16 computes in bf16, which has its range) or, when it says nothing, its
    token embedding is stored so; else ``"float32"``.

    Raises:
        FileNotFoundError: no ``config.json``. ValueError: it is not valid JSON.
    """
    import json

    try:
        config = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path / 'config.json'} is not valid JSON: {exc}") from exc
    text = config.get("text_config")
    text = text if isinstance(text, dict) else {}
    stored = (config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype")
              or text.get("dtype") or _embedding_dtype(path))
    return "bfloat16" if stored in ("bfloat16", "float16") else "float32"


_SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def _embedding_dtype(path: Path) -> str | None:
    """The stored dtype of the token embedding (``"bfloat16"``...), for configs that do not say
    (gpt-oss's releases); None when it cannot be read."""
    import json

    from safetensors import safe_open

    names = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight")
    index = path / "model.safetensors.index.json"
    try:
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            name = next(n for n in names if n in weight_map)
            file = path / weight_map[name]
        else:
            file = path / "model.safetensors"
        with safe_open(file, framework="numpy") as f:  # "pt" would import torch
            name = next(n for n in names if n in f.keys())
            return _SAFETENSORS_DTYPES.get(f.get_slice(name).get_dtype())
    except Exception:  # noqa: BLE001 - unreadable here: the loader reports it properly
        return None



def _stored_mxfp4(model) -> bool:
    """Whether the checkpoint folder ``model`` declares MXFP4 experts (gpt-oss's releases), whose
    host banks and resident experts stay MXFP4 under ``--moe-expert-format dense``."""
    import json

    try:
        raw = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, TypeError, ValueError):
        return False
    quant = raw.get("quantization_config") if isinstance(raw, dict) else None
    return isinstance(quant, dict) and quant.get("quant_method") == "mxfp4"


_DEVICE = re.compile(r"(cpu|cuda)(:\d+)?")


def device_type(device: str) -> str:
    """``"cpu"`` or ``"cuda"``: the type of a ``--device`` value (``cpu``, ``cuda``, ``cuda:1``),
    read without torch.

    Raises:
        ValueError: any other value.
    """
    match = _DEVICE.fullmatch(device)
    if match is None:
        raise ValueError(f"--device must be cpu or cuda[:i], got {device!r}")
    return match[1]


def check_moe_flags(args: argparse.Namespace):
    """Validate the device and MoE flags before anything loads; returns the ``MoeConfig``.
    Imports torch only for a CUDA device (to see that one is available).

    Raises:
        ValueError: an unknown or unavailable device, bad MoE settings, or a ``--record-routing``
            path that cannot be written.
    """
    from freetoken.offload.moe_config import MoeConfig

    kind = device_type(args.device)
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available to torch")
    record = args.record_routing
    if record is not None and (record.is_dir() or not record.parent.is_dir()):
        raise ValueError(f"--record-routing {record}: need a file path in an existing folder")
    expert_format = args.moe_expert_format
    if expert_format == "dense" and _stored_mxfp4(args.model):
        expert_format = "mxfp4"  # "dense" keeps a release's stored format: say so to MoeConfig
    moe = MoeConfig(backend=args.moe_backend, cache=args.moe_cache_slots, policy=args.moe_policy,
                    log_every=args.moe_log_every, expert_format=expert_format,
                    cpu_activations=args.moe_cpu_activations,
                    memory_floor=args.moe_memory_floor)
    if args.moe_backend == "offload" and args.moe_cpu_activations not in ("auto", "fp32"):
        _say(f"note: --moe-cpu-activations {args.moe_cpu_activations} has no effect: --moe-backend "
             "offload fills every miss into the cache, so the CPU expert kernel never runs")
    if args.moe_backend == "resident" or (args.moe_backend == "auto" and kind == "cpu"):
        # on a CPU device resident experts may keep a 4-bit format and its kernel activations
        flags = [("--moe-cache-slots", args.moe_cache_slots),
                 ("--moe-memory-floor", args.moe_memory_floor)]
        if kind != "cpu":
            flags.append(("--moe-cpu-activations", None if args.moe_cpu_activations
                          in ("auto", "fp32") else args.moe_cpu_activations))
        for flag, value in flags:
            if value is not None:
                _say(f"note: {flag} has no effect: --moe-backend {args.moe_backend} keeps every "
                     "expert resident" + (" on a CPU device" if args.moe_backend == "auto" else ""))
    return moe


def moe_settings(args: argparse.Namespace, path: Path, moe,
                 manifest: PackedManifest | None = None):
    """``(moe, (B_P, B_H) GB/s or None)`` for the checked ``MoeConfig`` ``moe`` (``manifest``:
    ``path``'s packed manifest when it is packed).

    The bandwidths come from ``--moe-profile``, else from the stored profile of this model and
    device; when the hybrid split may be used and no profile exists, a quick one (about 1 s) is
    measured now and stored (``freetoken profile`` measures longer).

    Raises:
        ValueError: a missing or corrupt profile file.
    """
    import torch

    device = torch.device(args.device)
    may_split = args.moe_backend == "hybrid" or (args.moe_backend == "auto" and device.type == "cuda")
    if args.moe_profile is None and not may_split:
        return moe, None
    from freetoken.models.config import ModelConfig
    from freetoken.offload.loading import planned_bank_dtype
    from freetoken.offload.profile import (
        default_profile_path,
        load_profile,
        measure_profile,
        save_profile,
    )

    bank = planned_bank_dtype(path, args.dtype, manifest)
    file = args.moe_profile or default_profile_path(path, device.type, bank)
    profile = load_profile(file)
    if profile is None and args.moe_profile is not None:
        raise ValueError(f"--moe-profile {file} does not exist")
    if profile is None:
        _say("no MoE profile for this model and device yet: measuring B_P and B_H (~1 s)")
        profile = measure_profile(ModelConfig.from_file(path), device=device.type,
                                  bank_dtype=bank, seconds=1.0, model=str(path))
        save_profile(profile, file)
    _say(f"MoE profile {file}: B_P {profile.bandwidth_p_gbps:.1f} GB/s, "
         f"B_H {profile.bandwidth_h_gbps:.1f} GB/s, B_P/B_H {profile.ratio:.3f}")
    return moe, (profile.bandwidth_p_gbps, profile.bandwidth_h_gbps)


def memory_plan(args: argparse.Namespace, path: Path, *, meminfo=None, device_memory=None,
                manifest: PackedManifest | None = None):
    """The :class:`~freetoken.engine.memory_plan.MemoryPlan` of the serve flags for the
    checkpoint ``path``, before anything loads (weights from its safetensors headers).

    Args:
        meminfo: a ``/proc/meminfo`` reader (tests); device_memory: ``(free, total)`` of the
            CUDA device (tests; default ``torch.cuda.mem_get_info``, the only use of torch).
        manifest: ``path``'s packed manifest when it is packed (read by the caller).

    Raises:
        PlanError: an explicit budget does not fit (the line to print).
    """
    from freetoken.engine.memory_plan import (
        Budgets,
        DeviceMemory,
        checkpoint_weight_bytes,
        host_memory,
        plan_memory,
        read_meminfo,
    )

    dev = None
    if device_type(args.device) == "cuda":
        if device_memory is None:
            import torch

            device_memory = torch.cuda.mem_get_info(torch.device(args.device))
        free, total = device_memory
        dev = DeviceMemory(total=total, free=free)
    resident = {"resident": True, "auto": None}.get(args.moe_backend, False)
    width = 2 if args.dtype == "bfloat16" else 4
    return plan_memory(host_memory(meminfo or read_meminfo), dev,
                       checkpoint_weight_bytes(path, width, manifest),
                       Budgets(kv_cache_bytes=args.kv_cache_bytes,
                               checkpoint_host_bytes=args.state_checkpoint_bytes),
                       experts_resident=resident, checkpoint_slots=args.state_checkpoint_slots,
                       device_name=args.device)


def moe_for_plan(moe: MoeConfig, plan) -> MoeConfig:
    """``moe`` with its default expert-cache size capped at the plan's room on a CUDA device
    (so the KV pool planned beside it still fits); unchanged on a CPU device or without a plan."""
    import dataclasses

    if plan is None or plan.on_cpu or plan.expert_cache_bytes <= 0:
        return moe
    return dataclasses.replace(moe, default_cache_bytes=plan.expert_cache_bytes)


def cache_settings(args: argparse.Namespace, plan=None):
    """The :class:`~freetoken.prefix.build.CacheConfig` of the serve flags; the budgets left
    unset come from ``plan`` (a ``MemoryPlan``; None: the library defaults)."""
    from freetoken.prefix.anchors import AnchorPolicy
    from freetoken.prefix.build import CacheConfig
    from freetoken.prefix.manager import DEFAULT_CHECKPOINT_HOST_BYTES

    host = args.state_checkpoint_bytes
    if host is None:
        host = DEFAULT_CHECKPOINT_HOST_BYTES if plan is None else plan.checkpoint_host_bytes
    return CacheConfig(
        page_size=args.page_size,
        kv_cache_bytes=args.kv_cache_bytes,
        kv_budget_bytes=None if plan is None else plan.kv_cache_bytes,
        checkpoint_slots=args.state_checkpoint_slots,
        checkpoint_host_bytes=host,
        checkpoint_host_floor=None if plan is None else plan.reserve_host,
        anchors=args.anchors if args.anchors is not None else AnchorPolicy.default(),
        prefix_reuse=not args.no_prefix_reuse,
        max_running_requests=args.max_running_requests,
    )


def serve(args: argparse.Namespace) -> int:
    """Run the server until interrupted; returns the exit status.

    Order: validate settings, bind the port and read the checkpoint's config (fail fast, exit
    status 2 with one ``[freetoken] error: ...`` line), print the listen address and the API
    endpoints, then serve at once while a background thread loads the model (``/health`` 503
    with the progress until it is ready, see ``freetoken.server.loading``). A load that fails
    prints ``[freetoken] error: cannot load ...`` and stops the server: exit status 2 (1 for an
    unexpected exception, with its traceback in the log).

    Nothing here imports torch on a CPU device (see the module docstring); the loader thread
    does.
    """
    import uvicorn

    from freetoken.engine.context_limit import check_max_model_len
    from freetoken.models.config import ModelConfig
    from freetoken.packed.manifest import is_packed, read_manifest
    from freetoken.server.config import ServerConfig
    from freetoken.server.loading import LoadingApp, LoadState, QuietLoadingPolls

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("uvicorn.access").addFilter(QuietLoadingPolls())
    try:
        moe = check_moe_flags(args)
        path = resolve_model(args.model)
        if args.dtype == "auto":
            args.dtype = checkpoint_compute_dtype(path)
        name = args.served_model_name or path.name
        config = ServerConfig(served_model_name=name, max_output_tokens=args.max_output_tokens,
                              api_key=args.api_key,
                              session_idle_timeout_s=float(args.session_idle_timeout),
                              max_sessions=args.max_sessions)
    except (FileNotFoundError, ValueError) as exc:
        _say(f"error: {exc}")
        return 2
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        _say(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 2
    _say(f"loading {path} ({args.dtype}, {args.device})")
    try:  # the config alone: an unsupported model or context is refused before serving
        check_max_model_len(ModelConfig.from_file(path), path, args.max_model_len)
        # the manifest and the bank files' sizes (checksums: as read), read once for the
        # memory plan and the loader
        manifest = read_manifest(path) if is_packed(path) else None
    except (FileNotFoundError, ValueError) as exc:
        sock.close()
        _say(f"error: cannot load {path}: {exc}")
        return 2
    try:  # explicit budgets that cannot fit are refused before loading
        plan = memory_plan(args, path, manifest=manifest)
    except ValueError as exc:
        sock.close()
        _say(f"error: {exc}")
        return 2
    for line in plan.table():
        _say(line)
    from freetoken.serve_load import BackgroundLoad

    state = LoadState()
    load = BackgroundLoad(args, path, moe, config, state, plan, manifest)
    server = _uvicorn_server(uvicorn.Config(LoadingApp(state, config, start=load.start),
                                            log_level=args.log_level), lambda: load.engine)
    load.on_failure = lambda: setattr(server, "should_exit", True)
    base = base_url(args.host, sock.getsockname()[1])
    _say(f"model '{name}' listening on {base} (GET /health answers 503 with the load progress "
         "until the model is ready)")
    for method, route, what in ENDPOINTS:
        _say(f"  {method:4} {base}{route}  ({what})")
    for sig in (signal.SIGINT, signal.SIGTERM):  # uvicorn re-raises it after a graceful shutdown
        signal.signal(sig, _interrupt)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C / SIGTERM after a graceful shutdown
        _say("stopped")
    finally:
        sock.close()
        load.stop()
    return load.exit_status


if __name__ == "__main__":  # pragma: no cover
    from freetoken.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
