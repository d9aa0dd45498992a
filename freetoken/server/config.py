"""Settings of the HTTP layer (one frozen dataclass, validated on construction)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerConfig:
    """What the OpenAI/Anthropic HTTP front needs to know besides the engine.

    Attributes:
        served_model_name: the name listed by ``GET /v1/models``. Requests may name any model;
            the loaded model serves them all and the requested name is echoed back.
        max_output_tokens: server-wide cap on generated tokens per request. A request asking
            for more is clamped (``SamplingParams.length_capped``) and, if it runs into the cap,
            finishes honestly with ``length`` / ``max_tokens``.
        default_max_tokens: generation limit used when the client sends none; ``None`` means
            the cap itself.
        api_key: when set, every ``/v1/*`` request must carry it as ``Authorization: Bearer
            <key>`` or ``x-api-key: <key>`` (401 otherwise). ``None`` disables the check.
        max_body_bytes: largest accepted request body in bytes (413 above it).
        ping_interval_s: seconds between keep-alive events on an open SSE stream (Anthropic
            ``ping`` events, OpenAI SSE comments), so clients' idle watchdogs survive a long
            prefill or a queue wait.
        session_idle_timeout_s: a harness session (``/v1/sessions``, or one made by detection)
            expires after this many seconds without a request.
        max_sessions: most sessions kept; the least recently used goes first beyond it.

    Raises:
        ValueError: a non-positive limit, ``default_max_tokens`` above the cap, or an empty
            model name / api key.
    """

    served_model_name: str = "freetoken"
    max_output_tokens: int = 8192
    default_max_tokens: int | None = None
    api_key: str | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    ping_interval_s: float = 10.0
    session_idle_timeout_s: float = 3600.0
    max_sessions: int = 1024

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise ValueError("served_model_name must be a non-empty string")
        if self.max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {self.max_output_tokens}")
        if self.default_max_tokens is not None and not (
            1 <= self.default_max_tokens <= self.max_output_tokens
        ):
            raise ValueError(
                f"default_max_tokens must be in [1, max_output_tokens={self.max_output_tokens}], "
                f"got {self.default_max_tokens}"
            )
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be None (no auth) or a non-empty string")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.ping_interval_s <= 0:
            raise ValueError(f"ping_interval_s must be > 0, got {self.ping_interval_s}")
        if self.session_idle_timeout_s <= 0:
            raise ValueError(
                f"session_idle_timeout_s must be > 0, got {self.session_idle_timeout_s}"
            )
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")

    @property
    def fallback_max_tokens(self) -> int:
        """Generation limit applied when a request names none (tokens)."""
        return self.default_max_tokens or self.max_output_tokens
