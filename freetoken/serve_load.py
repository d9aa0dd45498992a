"""The background load of ``freetoken serve``: the model is built in a daemon thread while the
loading server answers (``freetoken.server.loading``)."""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from freetoken.models.load_progress import LoadStep
    from freetoken.offload.moe_config import MoeConfig
    from freetoken.packed.manifest import PackedManifest
    from freetoken.server.config import ServerConfig
    from freetoken.server.loading import LoadState


class BackgroundLoad:
    """``AsyncEngine.from_pretrained`` and ``create_app`` in a daemon thread, reporting to a
    :class:`~freetoken.server.loading.LoadState`.

    Torch and the engine do not need the main thread: the engine already runs the model on its
    own loop thread, and the loader only allocates and copies tensors. ``on_failure`` is called
    (from the loader thread) after a failed load printed its error; ``exit_status`` is then 2
    (1 for an unexpected exception), else 0.
    """

    def __init__(self, args: argparse.Namespace, path: Path, moe: MoeConfig,
                 config: ServerConfig, state: LoadState, plan=None,
                 manifest: PackedManifest | None = None) -> None:
        self.args, self.path, self.moe = args, path, moe
        self.plan = plan  # the MemoryPlan: budgets not set by flags, GET /v1/freetoken/memory
        self.manifest = manifest  # the packed manifest serve read (None: a plain checkpoint)
        self.config, self.state = config, state
        self.on_failure: Callable[[], None] = lambda: None
        self.exit_status = 0
        self.engine = None  # the loaded AsyncEngine; stop() shuts it down once it serves
        self._thread = threading.Thread(target=self._run, name="freetoken-load", daemon=True)

    def start(self) -> None:
        """Start loading (once)."""
        if not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel a load still running (at its next tensor), wait up to ``timeout`` seconds for
        the thread, and shut the engine down when one was built."""
        self.state.close()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        if self.state.app is not None and self.engine is not None:  # else the loader owns it
            self.engine.shutdown()

    def _run(self) -> None:
        from freetoken.launch import _say
        from freetoken.server.loading import LoadCancelled

        try:
            self._load()
            return
        except LoadCancelled:
            return
        except (FileNotFoundError, ValueError) as exc:
            message, self.exit_status = f"cannot load {self.path}: {exc}", 2
        except Exception as exc:  # noqa: BLE001 - the process must still exit, not hang
            logging.getLogger("freetoken.server").exception("loading %s failed", self.path)
            message, self.exit_status = f"cannot load {self.path}: {type(exc).__name__}: {exc}", 1
        _say(f"error: {message}")
        self.state.fail(message)
        self.on_failure()

    def _load(self) -> None:
        import torch  # the first import of torch in the process: the server already answers

        from freetoken.engine.async_engine import AsyncEngine
        from freetoken.launch import _say, cache_settings, moe_for_plan, moe_settings
        from freetoken.server.app import create_app

        args, state = self.args, self.state
        started = time.perf_counter()
        state.set_stage("profile")
        moe, bandwidths = moe_settings(args, self.path, moe_for_plan(self.moe, self.plan),
                                       self.manifest)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
        engine = AsyncEngine.from_pretrained(
            self.path, dtype=dtype, device=args.device, max_model_len=args.max_model_len,
            packed=self.manifest,
            progress=_say, moe=moe, bandwidths=bandwidths, record_routing=args.record_routing,
            cache=cache_settings(args, self.plan),
            max_num_batched_tokens=args.max_num_batched_tokens,
            on_stage=state.set_stage, on_step=_test_delay(state.step))
        engine.memory_plan = self.plan
        try:
            app = create_app(engine, self.config)
        except BaseException:
            engine.shutdown()
            raise
        self.engine = engine
        if not state.finish(app):  # the server stopped meanwhile
            engine.shutdown()
            return
        info = engine.info
        _say(f"loaded {info.model_type} in {time.perf_counter() - started:.1f}s: "
             f"vocab {info.vocab_size}, context {info.max_model_len} tokens")
        _say(f"model '{self.config.served_model_name}' ready")


# Test-only: seconds the loader sleeps after reading the first tensor, so a test can see the
# server answer while it loads. Read by the loader thread only; never set it in production.
TEST_LOAD_DELAY_ENV = "FREETOKEN_TEST_LOAD_DELAY_S"


def _test_delay(step: Callable[[LoadStep], None]) -> Callable[[LoadStep], None]:
    """``step``, sleeping ``$FREETOKEN_TEST_LOAD_DELAY_S`` seconds after its first call."""
    delay = float(os.environ.get(TEST_LOAD_DELAY_ENV) or 0)
    if delay <= 0:
        return step
    calls = itertools.count()

    def delayed(s: LoadStep) -> None:
        step(s)
        if next(calls) == 0:
            time.sleep(delay)

    return delayed
