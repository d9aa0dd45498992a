"""Python face of the C++ CPU expert kernel (``csrc/``, built as ``freetoken.ops.cpu_moe._ext``).

Shape letters: T tokens, H hidden, I expert intermediate, N flat expert ids ``l * E + e``,
P (token, expert, weight) triples. Math: see :mod:`freetoken.ops.cpu_moe.reference`; weight
formats: :mod:`freetoken.ops.cpu_moe.formats`.

The handle returned by :func:`submit` / :func:`submit_banks` has ``wait()`` (block with the GIL
released, return ``out [T, H]`` fp32, re-raise a kernel error), ``done()`` (never blocks) and
``seconds()``: wall seconds the job ran on the kernel's pool, measured in C++ with
``std::chrono::steady_clock`` from the start of its compute to its end (queueing behind earlier
submissions not included); ``-1.0`` until ``done()``.

``activations`` (every entry point): ``"fp32"`` (default; the only mode of nvfp4 banks)
multiplies the weights with fp32 activations, exactly up to fp32 summation order (fp8: and the
rounding of each block scale's product), on every ISA variant; ``"q8"`` (mxfp4 and q4g
banks only) quantises the activations entering each matrix (``x``, then ``silu(g) * u``) to int8
per block of 32 columns and sums each block's products exactly in integers: faster, within
:data:`freetoken.ops.cpu_moe.Q8_TOLERANCE` of the fp32 result (reference:
:func:`freetoken.ops.cpu_moe.reference_q8.cpu_moe_reference_q8`); ``"bf16"`` (bf16 and fp8
banks) rounds those activations to bf16 (nearest even) and sums the exact products in fp32
(``vdpbf16ps`` on ``avx512_bf16``; for fp8 banks with AVX512_VBMI as well), within
:data:`freetoken.ops.cpu_moe.BF16_TOLERANCE` of the fp32 result (reference:
``cpu_moe_reference(..., activations="bf16")``).

gpt-oss experts (every entry point, keyword-only; transformers ``GptOssExperts`` with its
interleaved gate/up rows reordered to gate rows first at load): ``gate_up_bias [N, 2I]`` and
``down_bias [N, H]`` (fp32) are added to ``g`` / ``u`` and to the expert's down output,
``out[t] += w * (down @ act + down_bias[n])``; ``swiglu_limit`` switches the activation from
``silu(g) * u`` to ``(u' + 1) * g' * sigmoid(swiglu_alpha * g')`` with ``g' = min(g, limit)``,
``u' = clamp(u, -limit, limit)``. Both are applied in fp32 in every format, activation mode and
ISA variant (with ``"bf16"`` / ``"q8"`` the activation is computed in fp32 and then rounded /
quantised as usual). Without them the results are bit-identical to the plain SwiGLU kernel.
"""

from __future__ import annotations

import numbers

import torch

from freetoken.ops.cpu_moe import _ext
from freetoken.ops.cpu_moe.formats import ExpertBankView

CpuMoeHandle = _ext.MoeHandle
GPT_OSS_SWIGLU_ALPHA = 1.702  # transformers GptOssConfig.swiglu_alpha


def _glu_kwargs(gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None,
                swiglu_limit: float | None, swiglu_alpha: float) -> dict:
    """The gpt-oss keyword arguments of ``_ext.submit*`` with the scalars type-checked here (the
    extension checks the bias tensors and the scalars' values).

    Raises:
        TypeError: ``swiglu_limit`` is neither None nor a real number, or ``swiglu_alpha`` is
            not a real number (bools are refused: ``True`` is no limit anyone means).
    """
    def real(v: object) -> bool:
        return isinstance(v, numbers.Real) and not isinstance(v, bool)

    if swiglu_limit is not None and not real(swiglu_limit):
        raise TypeError(f"swiglu_limit must be a float or None, got {type(swiglu_limit).__name__}")
    if not real(swiglu_alpha):
        raise TypeError(f"swiglu_alpha must be a float, got {type(swiglu_alpha).__name__}")
    return dict(gate_up_bias=gate_up_bias, down_bias=down_bias,
                swiglu_limit=None if swiglu_limit is None else float(swiglu_limit),
                swiglu_alpha=float(swiglu_alpha))


def submit(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    isa: str | None = None,
    activations: str = "fp32",
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    swiglu_alpha: float = GPT_OSS_SWIGLU_ALPHA,
) -> CpuMoeHandle:
    """Queue the SwiGLU expert MLP on the kernel's thread pool and return at once.

    The work runs on a persistent pool of ``num_threads()`` threads (physical cores, or
    ``FREETOKEN_CPU_MOE_THREADS``) without the GIL, so the caller can launch device work and then
    call ``handle.wait()`` (a job that has not started by then, and is next in line, runs on the
    waiting thread and the pool's workers instead of being handed to the dispatcher thread).
    Submissions run one after another in submission order. The handle keeps ``x``, ``gate_up``,
    ``down`` and the biases alive until the work is done; the caller must not write them before
    ``wait()`` returns (routing tensors are copied at submit).

    Args:
        x: ``[T, H]`` fp32 or bf16 hidden states, contiguous, CPU.
        token_ids: ``[P]`` int64 token row of each triple, in ``[0, T)``.
        expert_ids: ``[P]`` int64 flat expert id of each triple, in ``[0, N)``; ``-1`` skips it.
        weights: ``[P]`` fp32 gate (top-k) weight of each triple.
        gate_up: ``[N, 2I, H]`` bf16 or fp32 host bank, rows ``[0:I]`` gate, ``[I:2I]`` up.
        down: ``[N, H, I]`` host bank of the same dtype as ``gate_up``.
        isa: ``"scalar"``, ``"avx2"``, ``"avx512"`` or ``"avx512_bf16"``; ``None`` reads
            ``FREETOKEN_CPU_MOE_ISA``, else the best variant this CPU supports
            (:func:`supported_isas`).
        activations: ``"fp32"``; ``"bf16"`` with bf16 (or fp8) banks; ``"q8"`` needs 4-bit banks
            (:func:`submit_banks`), so it is always refused here (ValueError).
        gate_up_bias: ``[N, 2I]`` fp32 contiguous CPU biases (gate ``[:, 0:I]``, up
            ``[:, I:2I]``) added to ``g`` and ``u`` before the activation, or None (zero).
        down_bias: ``[N, H]`` fp32 contiguous CPU biases added to each expert's down output
            before its gate weight, ``out[t] += w * (down @ act + down_bias[n])``, or None.
        swiglu_limit: None for ``silu(g) * u`` (Qwen3 / OLMoE); a number ``> 0`` for gpt-oss's
            ``(u' + 1) * g' * sigmoid(swiglu_alpha * g')``, ``g' = min(g, swiglu_limit)``,
            ``u' = clamp(u, -swiglu_limit, swiglu_limit)`` (``inf``: no clamp).
        swiglu_alpha: gpt-oss's sigmoid slope (default 1.702); finite; only with
            ``swiglu_limit`` (another value without it is a ValueError, it would be ignored).

    Returns:
        A handle whose ``wait()`` returns ``[T, H]`` fp32 gate-weighted partial sums, whose
        ``done()`` says, without blocking, whether they are ready, and whose ``seconds()`` gives
        the pool's wall time for the job (``-1.0`` until done).

    Raises:
        TypeError: an argument is not a torch.Tensor or has the wrong dtype (a bias: ``down_bias
            must be float32, got bfloat16``); ``swiglu_limit`` / ``swiglu_alpha`` not a real
            number.
        ValueError: wrong device, rank, shape agreement or contiguity; ``gate_up`` and ``down``
            of different dtypes; an id out of range; an unknown or unsupported ``isa``; an unknown
            ``activations`` (``unknown activations 'x'; expected one of: fp32, q8, bf16``),
            ``"q8"`` (``activations='q8' needs 4-bit expert banks (mxfp4 or q4g), got bf16``) or
            ``"bf16"`` with fp32 banks (``activations='bf16' needs bf16 or fp8 expert banks, got
            fp32``);
            a bias that is not contiguous, not on the CPU, or not of shape ``[N, 2I]`` /
            ``[N, H]`` (``gate_up_bias [4, 63] does not match the expert banks: expected
            [N, 2I] = [4, 64]``); ``swiglu_limit`` not ``> 0`` (NaN included);
            ``swiglu_alpha`` not finite, or not 1.702 with ``swiglu_limit=None``.
    """
    return _ext.submit(x, token_ids, expert_ids, weights, gate_up, down, isa=isa,
                       activations=activations,
                       **_glu_kwargs(gate_up_bias, down_bias, swiglu_limit, swiglu_alpha))


def submit_banks(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    banks: ExpertBankView,
    *,
    isa: str | None = None,
    activations: str = "fp32",
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    swiglu_alpha: float = GPT_OSS_SWIGLU_ALPHA,
) -> CpuMoeHandle:
    """:func:`submit` for banks in any weight format (bf16, fp32, mxfp4, q4g, fp8, nvfp4).

    Quantised weights are decoded inside the kernel, a block of columns at a time (no
    dequantised copy of a matrix): fp8 e4m3 values exactly, with each ``bm x bn`` block's fp32
    scale applied to the block's fp32 partial sum; nvfp4 e2m1 codes times their e4m3 scale
    exactly, with the row's global scale applied to the row's sum. Arguments other than
    ``banks`` and the result are as in :func:`submit`; the handle keeps every bank tensor alive
    until the work is done. ``activations="q8"`` (mxfp4 and q4g only; see the module doc)
    quantises the activations to int8 blocks of 32 columns; ``"bf16"`` (bf16 and fp8 banks)
    rounds them to bf16; nvfp4 banks take ``"fp32"`` only. ``gate_up_bias``, ``down_bias``,
    ``swiglu_limit`` and ``swiglu_alpha`` (gpt-oss experts) are as in :func:`submit`, with N, H
    and I those of ``banks``; a 4-bit gpt-oss checkpoint's rows must be reordered (gate rows
    first) in the codes and the scales alike.

    Raises:
        TypeError: a non-tensor, or a bank tensor of the wrong dtype for ``banks.format``
            (``gate_up_scales must be float8_e4m3fn, got float32``).
        ValueError: as :func:`submit`, plus bank tensors of the wrong rank, layout or device, or
            scale / zero-point / global shapes that do not match the codes (messages name the
            tensor, e.g. ``down_scales``, ``gate_up_global``; fp8: ``down_scales [4, 1, 2] does
            not match down_values [4, 64, 32] with block_size (128, 16): expected [N, ceil(R/bm),
            ceil(C/bn)] = [4, 1, 2]``); ``activations`` other than ``"fp32"`` / ``"q8"`` /
            ``"bf16"``, ``"q8"`` with bf16 / fp32 banks (``activations='q8' needs 4-bit expert
            banks (mxfp4 or q4g), got fp32``), ``"bf16"`` with other than bf16 / fp8 banks,
            ``"q8"`` with fp8 banks or either with nvfp4 banks (``activations='q8' is not
            supported with nvfp4 expert banks (they take activations='fp32')``); the bias and
            ``swiglu_*`` errors of :func:`submit` (TypeError / ValueError alike).
    """
    if not isinstance(banks, ExpertBankView):
        raise TypeError(f"banks must be an ExpertBankView, got {type(banks).__name__}")
    return _ext.submit_banks(x, token_ids, expert_ids, weights, banks.format, banks.gate_up,
                             banks.down, isa=isa, activations=activations,
                             block_size=banks.block_size,
                             **_glu_kwargs(gate_up_bias, down_bias, swiglu_limit, swiglu_alpha))


def cpu_moe_banks(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    banks: ExpertBankView,
    *,
    isa: str | None = None,
    activations: str = "fp32",
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    swiglu_alpha: float = GPT_OSS_SWIGLU_ALPHA,
) -> torch.Tensor:
    """``submit_banks(...).wait()``: the blocking form; same arguments, result and errors."""
    return submit_banks(x, token_ids, expert_ids, weights, banks, isa=isa,
                        activations=activations, gate_up_bias=gate_up_bias,
                        down_bias=down_bias, swiglu_limit=swiglu_limit,
                        swiglu_alpha=swiglu_alpha).wait()


def cpu_moe(
    x: torch.Tensor,
    token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    isa: str | None = None,
    activations: str = "fp32",
    gate_up_bias: torch.Tensor | None = None,
    down_bias: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    swiglu_alpha: float = GPT_OSS_SWIGLU_ALPHA,
) -> torch.Tensor:
    """``submit(...).wait()``: the blocking form; same arguments, result and errors."""
    return submit(x, token_ids, expert_ids, weights, gate_up, down, isa=isa,
                  activations=activations, gate_up_bias=gate_up_bias, down_bias=down_bias,
                  swiglu_limit=swiglu_limit, swiglu_alpha=swiglu_alpha).wait()


def quantize_q8(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's own q8 block quantiser (csrc ``quantize_q8``, column order), for tests.

    Args:
        v: ``[R, C]`` fp32 contiguous CPU tensor, C a multiple of 32.

    Returns:
        ``(q [R, C] int8, d [R, C / 32] fp32)``, bit-equal to
        :func:`freetoken.ops.cpu_moe.reference_q8.quantize_q8_blocks`.

    Raises:
        TypeError: not a tensor, or not float32. ValueError: wrong rank, device, layout or C.
    """
    return _ext.quantize_q8(v)


def cpu_has_avx512_vnni() -> bool:
    """Whether the CPU reports AVX512_VNNI as well as the avx512 variant's features: the avx512
    variants then run the ``q8_avx512_vnni`` kernel for int8 activations, else ``q8_avx2``."""
    return bool(_ext.cpu_has_avx512_vnni())


def cpu_has_avx512_vbmi() -> bool:
    """Whether the CPU reports AVX512_VBMI with the ``avx512_bf16`` variant's features: that
    variant then runs the ``fp8_dpbf16`` kernel for fp8 banks with bf16 activations."""
    return bool(_ext.cpu_has_avx512_vbmi())


def kernel_runnable(name: str, isa: str) -> bool:
    """Whether this CPU can run the kernel ``name`` listed for ISA variant ``isa`` by
    :func:`kernels` (the variant is supported, and AVX512_VNNI for ``q8_avx512_vnni``,
    AVX512_VBMI for ``fp8_dpbf16``)."""
    if isa not in supported_isas():
        return False
    if name == "q8_avx512_vnni":
        return cpu_has_avx512_vnni()
    return name != "fp8_dpbf16" or cpu_has_avx512_vbmi()


def supported_isas() -> tuple[str, ...]:
    """ISA variants this CPU can run, best last (``"scalar"`` is always first)."""
    return tuple(_ext.supported_isas())


def kernels() -> tuple[tuple[str, str, int], ...]:
    """Every CPU kernel of the extension as ``(name, isa, calls)``: the ``rows_dot`` kernels (e.g.
    ``"bf16_avx512"``), then the decode attention cores (``"attend_avx2"``, ...); the lowest ISA
    variant that runs it, and how many kernel calls in this process ran it (each call counts
    once per kernel it used)."""
    return tuple((str(n), str(i), int(c)) for n, i, c in _ext.kernels())


def num_threads() -> int:
    """Worker threads of the process-wide kernel pool (starting it if needed)."""
    return int(_ext.num_threads())
