"""The CPU branch of the miss split: misses computed in place from the host banks.

Runs the project's C++ kernel (``freetoken.ops.cpu_moe``: asynchronous, GIL released, persistent
thread pool), which takes every bank format :class:`ExpertBanks` can hold (bf16, fp32, mxfp4,
q4g), with fp32 activations, int8 ones for 4-bit banks (``activations="q8"``) or bf16 ones for
bf16 banks (``"bf16"``), and gpt-oss's biased, clamped experts. A handle returns the gate-weighted per-token partial sums ``[T, H]`` in
fp32 and how long the kernel worked, which the online split correction needs.
"""

from __future__ import annotations

import torch

from freetoken.offload.banks import ExpertBanks
from freetoken.ops.cpu_moe import cpu


class _Done:
    """A CPU branch with nothing to do."""

    def __init__(self, out: torch.Tensor, seconds: float) -> None:
        self._out, self._seconds = out, seconds

    def wait(self) -> torch.Tensor:
        """``[T, H]`` fp32."""
        return self._out

    def seconds(self) -> float:
        """CPU seconds spent."""
        return self._seconds


class _Kernel:
    """A pending C++ kernel job; ``seconds()`` is its own measured run time after ``wait()``."""

    def __init__(self, handle) -> None:
        self._handle, self._seconds = handle, 0.0

    def wait(self) -> torch.Tensor:
        """Block (GIL released) until done; ``[T, H]`` fp32."""
        out = self._handle.wait()
        self._seconds = float(self._handle.seconds())
        return out

    def seconds(self) -> float:
        """Seconds the job ran on the kernel's pool."""
        return self._seconds


class CpuBranch:
    """Runs (token, flat expert id, weight) triples over the host banks.

    Args:
        banks: the host expert banks.
        activations: the kernel's ``activations``: ``"fp32"``, ``"q8"`` (4-bit banks only) or
            ``"bf16"`` (bf16 banks only); the kernel raises ValueError at the first submit
            otherwise (``MoeConfig`` and the loader check it before).
    """

    def __init__(self, banks: ExpertBanks, activations: str = "fp32") -> None:
        self.banks = banks
        self.activations = activations

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
        act = self.banks.activation()
        return _Kernel(cpu.submit_banks(x, token_ids, flat_ids, weights, self.banks.kernel_view(),
                                        activations=self.activations,
                                        **(act.kernel_args() if act is not None else {})))
