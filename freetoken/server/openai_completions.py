"""``/v1/completions`` (legacy text completions): raw prompt in, raw model text out (no chat
template, no parser). Shapes follow the OpenAI Completions reference, including the legacy
``logprobs`` object (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``).
Extension shared with vLLM: ``response_format`` (chat's shapes) constrains the text to JSON."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from sse_starlette import ServerSentEvent

from freetoken.core import GenerationOutput, GenerationRequest
from freetoken.server.context import ServerContext, now
from freetoken.server.errors import APIError, bad_request
from freetoken.server.generation import (
    EngineFailure,
    StreamStopped,
    close_quietly,
    engine_outputs,
    finish_of,
)
from freetoken.server.ids import completion_id
from freetoken.server.openai_chat import (
    check_unsupported,
    openai_usage,
    stream_error_event,
)
from freetoken.server.openai_protocol import CompletionRequest
from freetoken.server.prompt import encode_text
from freetoken.server.sampling import build_sampling, parse_logit_bias, stop_strings
from freetoken.server.sessions import HarnessBinding
from freetoken.server.streaming import data_event
from freetoken.server.structured import chat_format, constrain
from freetoken.server.tools import ToolPolicy

log = logging.getLogger("freetoken.server")
NO_TOOLS = ToolPolicy(None, parse_tools=False)

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` of a completions request that sends none (the OpenAI Completions default, also
vLLM's); chat requests default to the server's limit instead."""


@dataclass(frozen=True)
class CompletionJob:
    """A validated completions request: engine request plus what the response echoes."""

    request: GenerationRequest
    model: str
    created: int
    want_logprobs: bool
    binding: HarnessBinding | None = None

    def record(self, ctx: ServerContext) -> Callable[[GenerationOutput], None]:
        """The finish hook adding this request to its session's totals."""
        return lambda out: ctx.record(self.binding, self.request.prompt_ids, out)


def prompt_ids(ctx: ServerContext, prompt: str | list) -> tuple[int, ...]:
    """Token ids of a ``prompt`` given as text, token ids, or a one-element list of either.

    Raises:
        APIError: 400 for several prompts, an empty prompt, or ids outside ``[0, vocab_size)``.
    """
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise bad_request("prompt: only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tuple(encode_text(ctx.engine.tokenizer, prompt))
    else:
        ids = tuple(prompt)
        vocab = ctx.engine.info.vocab_size
        for i, tok in enumerate(ids):
            if not 0 <= tok < vocab:
                raise bad_request(
                    f"prompt.{i}: token id {tok} is outside the vocabulary [0, {vocab})",
                    param="prompt",
                )
    if not ids:
        raise bad_request("prompt: the prompt is empty", param="prompt")
    return ids


def prepare_completion(
    ctx: ServerContext, req: CompletionRequest, binding: HarnessBinding | None = None
) -> CompletionJob:
    """Validate a completions request, tokenize its prompt and clamp its sampling parameters
    (``max_tokens`` defaults to :data:`DEFAULT_MAX_TOKENS`).

    Raises:
        APIError: 400 for ``n`` > 1, ``echo``, ``suffix``, a bad ``response_format`` (as on chat,
            :mod:`freetoken.server.structured`), a bad prompt, or one that does not fit the
            context (``context_length_exceeded``).
    """
    check_unsupported(req.n)
    if req.echo:
        raise bad_request("echo: echo is not supported", param="echo")
    if req.suffix:
        raise bad_request("suffix: suffix is not supported", param="suffix")
    ids = prompt_ids(ctx, req.prompt)
    ctx.check_context(len(ids), "openai", "prompt")
    sampling = build_sampling(
        config=ctx.config,
        requested_max_tokens=req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS,
        prompt_len=len(ids),
        max_model_len=ctx.engine.info.max_model_len,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=stop_strings(req.stop, "stop"),
        ignore_eos=req.ignore_eos,
        logit_bias=parse_logit_bias(req.logit_bias, ctx.engine.tokenizer.vocab_size),
        logprobs=req.logprobs,
    )
    # A raw prompt has no template framing: the answer grammar is the bare JSON value.
    sampling = constrain(sampling, NO_TOOLS, chat_format(req.response_format), None, False)
    rid = completion_id()
    anchors = binding.anchors if binding is not None else None
    return CompletionJob(
        GenerationRequest(rid, ids, sampling, anchors),
        ctx.model_name(req.model),
        now(),
        req.logprobs is not None,
        binding,
    )


class _LogprobsBuilder:
    """Accumulates the legacy ``logprobs`` object; ``text_offset`` counts characters of output."""

    def __init__(self) -> None:
        self.offset = 0

    def chunk(self, out: GenerationOutput) -> dict:
        """Logprobs of the tokens in ``out``."""
        body: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for lp in out.logprobs or ():
            body["tokens"].append(lp.token)
            body["token_logprobs"].append(lp.logprob)
            body["top_logprobs"].append({tok: val for _, tok, val in lp.top})
            body["text_offset"].append(self.offset)
            self.offset += len(lp.token)
        return body


def _merge(total: dict, part: dict) -> None:
    for key, values in part.items():
        total[key].extend(values)


async def complete_text(ctx: ServerContext, job: CompletionJob) -> dict:
    """Run ``job`` and build the ``text_completion`` object.

    Raises:
        APIError: 400 when the engine rejects the request.
        EngineFailure: the engine failed mid-generation.
    """
    texts: list[str] = []
    builder = _LogprobsBuilder()
    logprobs: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    last = None
    async for out in engine_outputs(ctx.engine, job.request, job.record(ctx)):
        texts.append(out.text)
        if job.want_logprobs:
            _merge(logprobs, builder.chunk(out))
        last = out
    assert last is not None
    fin = finish_of(last)
    choice = {
        "index": 0,
        "text": "".join(texts),
        "logprobs": logprobs if job.want_logprobs else None,
        "finish_reason": fin.reason,
    }
    return {
        "id": job.request.request_id,
        "object": "text_completion",
        "created": job.created,
        "model": job.model,
        "choices": [choice],
        "usage": openai_usage(fin),
    }


async def stream_text(
    ctx: ServerContext, job: CompletionJob, include_usage: bool
) -> AsyncIterator[ServerSentEvent]:
    """``text_completion`` chunks (one per engine chunk, the last with ``finish_reason``), an
    optional usage chunk with empty ``choices``, then ``[DONE]``; an error event on failure."""
    base = {
        "id": job.request.request_id,
        "object": "text_completion",
        "created": job.created,
        "model": job.model,
    }
    builder = _LogprobsBuilder()
    outputs = engine_outputs(ctx.engine, job.request, job.record(ctx))
    try:
        async for out in outputs:
            choice = {
                "index": 0,
                "text": out.text,
                "logprobs": builder.chunk(out) if job.want_logprobs else None,
                "finish_reason": out.finish_reason,
            }
            body = {**base, "choices": [choice]}
            if include_usage:
                body["usage"] = None
            yield data_event(body)
            if out.finish_reason is not None and include_usage:
                yield data_event({**base, "choices": [], "usage": openai_usage(finish_of(out))})
        yield data_event("[DONE]")
    except StreamStopped as exc:  # the server is stopping: a complete stream with an error
        yield stream_error_event(exc)
        yield data_event("[DONE]")
    except (APIError, EngineFailure) as exc:
        yield stream_error_event(exc)
    except Exception as exc:  # noqa: BLE001 - headers are out: report in-band, then close
        log.exception("completion stream %s failed", job.request.request_id)
        yield stream_error_event(APIError(500, f"internal error: {exc}"))
    finally:
        await close_quietly(outputs)
