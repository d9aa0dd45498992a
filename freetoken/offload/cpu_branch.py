"""The CPU branch of the miss split: misses computed in place from the host banks.

Uses the project's C++ kernel (``freetoken.ops.cpu_moe``: asynchronous, GIL released, persistent
thread pool) when it supports the bank dtype; otherwise a plain-torch fp32 computation run at
submit time (correct, synchronous, slower). Both return the gate-weighted per-token partial sums
``[T, H]`` in fp32 and how long the CPU worked, which the online split correction needs.
"""

from __future__ import annotations

import logging
import time

import torch

from freetoken.offload.banks import ExpertBanks
from freetoken.ops.cpu_moe.reference import cpu_moe_reference

logger = logging.getLogger("freetoken.offload")


class _Done:
    """A finished CPU-branch result (torch fallback or nothing to do)."""

    def __init__(self, out: torch.Tensor, seconds: float) -> None:
        self._out, self._seconds = out, seconds

    def wait(self) -> torch.Tensor:
        """``[T, H]`` fp32."""
        return self._out

    def seconds(self) -> float:
        """CPU seconds spent."""
        return self._seconds


class _Kernel:
    """A pending C++ kernel job; ``seconds()`` is its measured run time after ``wait()``."""

    def __init__(self, handle, submitted: float) -> None:
        self._handle, self._submitted, self._seconds = handle, submitted, 0.0

    def wait(self) -> torch.Tensor:
        """Block (GIL released) until done; ``[T, H]`` fp32."""
        out = self._handle.wait()
        timed = getattr(self._handle, "seconds", None)
        self._seconds = float(timed()) if timed is not None else time.perf_counter() - self._submitted
        return out

    def seconds(self) -> float:
        """CPU seconds the job ran (the kernel's own clock when it has one)."""
        return self._seconds


def _kernel_supports(dtype: torch.dtype) -> bool:
    try:
        from freetoken.ops.cpu_moe import cpu
    except ImportError:  # pragma: no cover - the extension is part of the package build
        return False
    bank = torch.zeros(1, 2, 1, dtype=dtype), torch.zeros(1, 1, 1, dtype=dtype)
    try:
        cpu.cpu_moe(torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64),
                    torch.zeros(1, dtype=torch.int64), torch.ones(1), *bank)
    except (TypeError, ValueError):
        return False
    return True


class CpuBranch:
    """Runs (token, flat expert id, weight) triples over the host banks.

    Args:
        banks: the host expert banks.

    Attributes:
        uses_kernel: True when the C++ kernel serves this bank dtype.
    """

    def __init__(self, banks: ExpertBanks) -> None:
        self.banks = banks
        self.uses_kernel = banks.view is not None or _kernel_supports(banks.dtype)
        if not self.uses_kernel:
            logger.warning("the C++ expert kernel does not take %s banks; the CPU branch runs "
                           "in plain torch", banks.dtype)

    def submit(self, x: torch.Tensor, token_ids: torch.Tensor, flat_ids: torch.Tensor,
               weights: torch.Tensor):
        """Start the CPU branch and return a handle with ``wait() -> [T, H] fp32`` and ``seconds()``.

        Args:
            x: ``[T, H]`` hidden states (any device; copied to host fp32/bf16 contiguous).
            token_ids: ``[P]`` int64 token rows (host).
            flat_ids: ``[P]`` int64 flat expert ids (host).
            weights: ``[P]`` fp32 gate weights (host).
        """
        if token_ids.numel() == 0:
            return _Done(torch.zeros(x.shape, dtype=torch.float32), 0.0)
        x = x.detach().to("cpu")
        if x.dtype not in (torch.float32, torch.bfloat16):
            x = x.float()
        x = x.contiguous()
        b = self.banks
        if self.uses_kernel:
            from freetoken.ops.cpu_moe import cpu

            started = time.perf_counter()
            return _Kernel(cpu.submit_banks(x, token_ids, flat_ids, weights, b.kernel_view()),
                           started)
        started = time.perf_counter()
        out = cpu_moe_reference(x, token_ids, flat_ids, weights, b.gate_up, b.down)
        return _Done(out, time.perf_counter() - started)
