"""Typed objects shared between the HTTP layer, the engine and the model runner.

The API layer builds a :class:`GenerationRequest` (prompt token ids + :class:`SamplingParams`) and
receives a stream of :class:`GenerationOutput` chunks from the engine. Nothing else crosses the
API/engine boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token and when to stop.

    Attributes:
        max_tokens: most tokens to generate (already clamped by the server's output cap).
        temperature: softmax temperature; ``0`` means greedy (argmax).
        top_p: nucleus mass in (0, 1]; ``1.0`` disables it.
        top_k: keep the k most likely tokens; ``0`` disables it.
        seed: seeds a per-request ``torch.Generator`` so sampled output is reproducible.
        stop: stop strings; the matched string is not part of the output text.
        stop_token_ids: extra token ids that end generation (in addition to the model's EOS ids
            unless ``ignore_eos``); the stop token is not part of the output text.
        ignore_eos: generate to ``max_tokens`` ignoring EOS ids (benchmarks rely on this).
        logprobs: when not None, return the sampled token's logprob and this many top
            alternatives per generated token.
        length_capped: True when the server's output cap lowered the request's own limit, so
            a ``length`` finish reflects the cap (reported honestly as ``length``).
        grammar: a ``freetoken.constrain.ToolCallGrammar`` (forced tool call: ``tool_choice``
            required / named / any / tool) or ``JsonAnswerGrammar`` (structured output) that
            every sampled token must follow, or None.
        logit_bias: ``(token_id, bias)`` pairs added to the logits before sampling (OpenAI
            ``logit_bias``; ids in the vocabulary, biases in [-100, 100]); logprobs stay those of
            the raw logits.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    length_capped: bool = False
    grammar: Any = None
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One request handed to the engine.

    Attributes:
        request_id: unique id (used for logs and abort).
        prompt_ids: the full rendered prompt as token ids (int, < vocab size).
        sampling: sampling and stopping parameters.
        anchors: the block kinds that get recurrent-state checkpoints for this request (a
            ``freetoken.prefix.anchors.AnchorPolicy``, chosen per session by a harness adapter);
            None uses the server's ``--anchors``.
        report_admission: also send one empty chunk (no tokens, no finish) when the request is
            first admitted, before its prefill runs: its ``cached_tokens`` is then known
            (Anthropic's ``message_start`` usage reports it).
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    anchors: Any = None
    report_admission: bool = False


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one generated token (natural log) and its top alternatives."""

    token_id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()


@dataclass(frozen=True)
class GenerationOutput:
    """One streamed chunk of a request's output.

    Attributes:
        request_id: the request this chunk belongs to.
        token_ids: the token ids generated since the previous chunk (may be empty on the
            final chunk).
        text: newly decoded text since the previous chunk; never splits a UTF-8 character and
            never contains (a prefix of) a matched stop string.
        finish_reason: None while running; then ``stop`` (EOS, stop token or stop string),
            ``length`` (max_tokens reached), ``abort`` or ``error``.
        stop_reason: the matched stop string (str) or stop token id (int), else None.
        prompt_tokens: number of prompt tokens.
        completion_tokens: number of tokens generated so far (cumulative).
        cached_tokens: prompt tokens served from a prefix cache (0 until prefix reuse exists).
        logprobs: per-token logprobs for ``token_ids`` when requested.
        error: message when finish_reason is ``error``.
    """

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    error: str | None = None


@dataclass(frozen=True)
class ResidentExperts:
    """Resident routed experts kept in a kernel format on a CPU device.

    Attributes:
        format: the banks' format (``mxfp4``, ``q4g``, ``nvfp4``, ``fp8``).
        bytes: host bytes of every layer's banks (codes, scales, biases excluded).
        cpu_activations: the expert kernel's activations (``fp32``, ``q8``).
    """

    format: str
    bytes: int
    cpu_activations: str


@dataclass(frozen=True)
class EngineInfo:
    """Static facts about the served model that the API layer needs (``resident_experts``:
    set when resident experts keep a kernel format, see ``freetoken.offload.resident``)."""

    model_path: str
    model_type: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    resident_experts: ResidentExperts | None = None
