"""Session-wide test helpers shared by every test folder."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# transformers routes Qwen3-Next linear attention to flash-linear-attention's triton kernels when
# that package is importable, and those crash on CPU; with this it uses its torch fallback.
sys.modules["fla"] = None

# On a 2-CPU machine shared with other processes (CI runs agent clients next to the server), two
# OpenMP threads stall in every parallel region whenever the other core is busy: measured 10-20x
# slower model steps than one thread. One intra-op thread keeps the suite fast and steady.
if (os.cpu_count() or 1) <= 2:
    torch.set_num_threads(1)


def _cpu_isas() -> tuple[str, ...]:
    from freetoken.ops.cpu_moe.cpu import supported_isas

    return supported_isas()


@pytest.fixture(params=_cpu_isas())
def every_cpu_isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test once per CPU expert-kernel ISA variant this CPU supports (forced through
    ``FREETOKEN_CPU_MOE_ISA``), so a CPU with more features cannot hide a broken variant."""
    monkeypatch.setenv("FREETOKEN_CPU_MOE_ISA", request.param)
    return request.param


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_checkpoint(arch) -> Path``: the seed-0 ``tiny`` checkpoint of ``arch``
    (``"qwen3_moe"`` or ``"qwen3_next"``), generated once per test session."""
    from freetoken.models.tiny import make_tiny

    root = tmp_path_factory.mktemp("tiny-checkpoints")
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = make_tiny(arch, "tiny", root / arch, seed=0)
        return made[arch]

    return get


@pytest.fixture(scope="session")
def harmony_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tiny gpt_oss tokenizer (the committed 8k BPE plus the harmony special tokens,
    ``freetoken.models.tiny_tokens``) with its stop tokens ``<|return|>``, ``<|endoftext|>``,
    ``<|call|>`` as ``generation_config.json`` EOS ids; no checkpoint needed."""
    import json

    from freetoken.models.tiny_tokens import family_tokenizer, stop_tokens, token_id
    from freetoken.tokenizer.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("harmony-tokenizer")
    data = family_tokenizer("gpt_oss")
    (root / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    eos = [token_id(data, token) for token in stop_tokens("gpt_oss")]
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return Tokenizer.from_pretrained(root)


def _kernel_report() -> tuple[list[str], list[str]]:
    """(lines describing the CPU expert kernels this run exercised, names of kernels this CPU can
    run that no test ran)."""
    from freetoken.ops.cpu_moe.cpu import kernel_runnable, kernels, supported_isas

    isas = supported_isas()
    table = kernels()
    ran = [f"{name} ({calls})" for name, _, calls in table if calls]
    missed = [name for name, isa, calls in table if kernel_runnable(name, isa) and not calls]
    other = [name for name, isa, _ in table if not kernel_runnable(name, isa)]
    lines = [f"CPU expert kernel: ISA variants on this CPU: {', '.join(isas)}",
             f"CPU expert kernel: kernels exercised (calls): {', '.join(ran) or 'none'}"]
    if missed:
        lines.append(f"CPU expert kernel: runnable here but not exercised: {', '.join(missed)}")
    if other:
        lines.append(f"CPU expert kernel: not runnable on this CPU (untested here): "
                     f"{', '.join(other)}")
    return lines, missed


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With FREETOKEN_REQUIRE_ALL_KERNELS=1 (set by .ci/run) a run that left a kernel this CPU
    can run unexercised fails: a green CI then proves every variant the machine has."""
    if os.environ.get("FREETOKEN_REQUIRE_ALL_KERNELS") == "1" and exitstatus == 0:
        _, missed = _kernel_report()
        if missed:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    lines, missed = _kernel_report()
    for line in lines:
        terminalreporter.write_line(line)
    if missed and os.environ.get("FREETOKEN_REQUIRE_ALL_KERNELS") == "1":
        terminalreporter.write_line("CPU expert kernel: FAILED: FREETOKEN_REQUIRE_ALL_KERNELS=1 "
                                    "and some runnable kernels were never exercised")
