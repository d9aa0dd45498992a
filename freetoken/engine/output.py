"""Turns sampled tokens into :class:`GenerationOutput` chunks and decides when a request stops.

Stop conditions, checked in this order for every new token (vLLM ``check_stop`` order):

1. EOS ids (unless ``ignore_eos``) and ``stop_token_ids`` -> ``stop`` with the token id as
   ``stop_reason``; the token is counted and returned in ``token_ids`` but not decoded.
2. A stop string completed by the decoded text -> ``stop`` with the string as ``stop_reason``;
   the string and anything after it are cut from the text.
3. ``max_tokens`` generated or the sequence reaching ``max_model_len`` -> ``length``.

Text goes through the incremental detokeniser (never splits a UTF-8 character) and then the
stop-string matcher (holds back possible stop-string prefixes).
"""

from __future__ import annotations

from freetoken.core import FinishReason, GenerationOutput, TokenLogprob
from freetoken.engine.batch import ForwardOutput
from freetoken.engine.detokenizer import ByteLevelDetokenizer, WindowDetokenizer
from freetoken.engine.request import EngineRequest
from freetoken.engine.stop import StopStringMatcher
from freetoken.tokenizer.tokenizer import Tokenizer


class RequestOutputProcessor:
    """Per-request detokenisation, stop handling and chunk building.

    Args:
        req: the request (its ``output_ids`` already include each new token when
            :meth:`on_token` is called).
        tokenizer: for the token strings of logprobs.
        detokenizer: a fresh incremental detokeniser for this request.
        eos_token_ids: the model's EOS ids.
        max_model_len: the sequence-length limit.
    """

    def __init__(
        self,
        req: EngineRequest,
        tokenizer: Tokenizer,
        detokenizer: ByteLevelDetokenizer | WindowDetokenizer,
        eos_token_ids: tuple[int, ...],
        max_model_len: int,
    ) -> None:
        self.req = req
        sp = req.request.sampling
        self._tokenizer = tokenizer
        self._detok = detokenizer
        self._stop = StopStringMatcher(sp.stop)
        self._stop_ids = frozenset(sp.stop_token_ids) | (
            frozenset() if sp.ignore_eos else frozenset(eos_token_ids)
        )
        self._max_model_len = max_model_len

    def on_token(self, out: ForwardOutput) -> GenerationOutput:
        """The chunk for one newly sampled token (``finish_reason`` set when it ends the request).

        Raises:
            ValueError: ``out`` carries no token.
        """
        token = out.token_id
        if token is None:
            raise ValueError("ForwardOutput has no sampled token")
        sp = self.req.request.sampling
        finish: FinishReason | None = None
        stop_reason: str | int | None = None
        if token in self._stop_ids:
            finish, stop_reason = "stop", token
            text, _ = self._flush()
        else:
            text, matched = self._stop.feed(self._detok.add(token))
            if matched is not None:
                finish, stop_reason = "stop", matched
            elif (
                len(self.req.output_ids) >= sp.max_tokens
                or self.req.num_tokens >= self._max_model_len
            ):
                tail, matched = self._flush()
                text += tail
                finish = "length" if matched is None else "stop"
                stop_reason = matched
        logprobs = None if sp.logprobs is None else (self._token_logprob(token, out),)
        return self._chunk((token,), text, finish, stop_reason, logprobs)

    def admitted(self) -> GenerationOutput:
        """The empty chunk sent at admission (``GenerationRequest.report_admission``)."""
        return self._chunk((), "", None, None, None)

    def final(self, reason: FinishReason, error: str | None = None) -> GenerationOutput:
        """An empty last chunk for a request ended from outside (``abort`` or ``error``)."""
        return self._chunk((), "", reason, None, None, error)

    def _flush(self) -> tuple[str, str | None]:
        text, matched = self._stop.feed(self._detok.flush())
        return (text if matched is not None else text + self._stop.flush()), matched

    def _token_logprob(self, token: int, out: ForwardOutput) -> TokenLogprob:
        decode = self._tokenizer.decode
        top = tuple((i, decode([i]), lp) for i, lp in out.top_logprobs)
        logprob = float("nan") if out.logprob is None else out.logprob
        return TokenLogprob(token, decode([token]), logprob, top)

    def _chunk(
        self,
        token_ids: tuple[int, ...],
        text: str,
        finish: FinishReason | None,
        stop_reason: str | int | None,
        logprobs: tuple[TokenLogprob, ...] | None,
        error: str | None = None,
    ) -> GenerationOutput:
        return GenerationOutput(
            request_id=self.req.request.request_id,
            token_ids=token_ids,
            text=text,
            finish_reason=finish,
            stop_reason=stop_reason,
            prompt_tokens=self.req.num_prompt_tokens,
            completion_tokens=len(self.req.output_ids),
            cached_tokens=self.req.num_cached_tokens,
            logprobs=logprobs,
            error=error,
        )
