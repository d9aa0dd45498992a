"""``/v1/chat/completions``: request → :class:`ChatJob`; the job's output in both response modes.

Response shapes follow the OpenAI Chat Completions reference (``chat.completion`` object and
``chat.completion.chunk`` stream). Extensions as in vLLM: ``reasoning_content`` on the message and
in deltas. A streamed tool call takes two deltas with the same ``index``: the first carries ``id``,
``type`` and ``function.name`` (``arguments: ""``), the second the full ``arguments``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent

from freetoken.parsers.events import ReasoningDelta, TextDelta, ToolCallEvent
from freetoken.server.context import ChatJob, ServerContext, now
from freetoken.server.errors import APIError, bad_request, openai_error_body
from freetoken.server.generation import (
    EngineFailure,
    Finish,
    StreamStopped,
    close_quietly,
)
from freetoken.server.ids import chat_completion_id, openai_tool_call_id
from freetoken.server.messages import from_openai
from freetoken.server.openai_protocol import ChatCompletionRequest
from freetoken.server.prompt import effort_from_kwargs, thinking_from_kwargs
from freetoken.server.sampling import build_sampling, parse_logit_bias, stop_strings
from freetoken.server.streaming import data_event
from freetoken.server.sessions import HarnessBinding
from freetoken.server.structured import chat_format, constrain
from freetoken.server.tools import openai_tools

log = logging.getLogger("freetoken.server")


def openai_usage(fin: Finish) -> dict:
    """OpenAI ``usage`` (with ``prompt_tokens_details.cached_tokens``) of a finished request."""
    return {
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
    }


def check_unsupported(n: int | None) -> None:
    """Raises APIError 400 for ``n`` > 1 (one choice per request)."""
    if n is not None and n != 1:
        raise bad_request("n: only n=1 is supported", param="n")


def prepare_chat(
    ctx: ServerContext, req: ChatCompletionRequest, binding: HarnessBinding | None = None
) -> ChatJob:
    """Validate, render and tokenize a chat request and clamp its sampling parameters.

    ``binding`` (the request's harness session) normalises the messages before templating and
    travels with the job (anchor policy, session totals).

    Raises:
        APIError: 400 for unsupported options (``n`` > 1, ``logprobs``), a bad
            ``response_format`` (:mod:`freetoken.server.structured`), bad messages or tools,
            template errors, or a prompt that does not fit the context
            (``context_length_exceeded``).
    """
    check_unsupported(req.n)
    if req.logprobs:
        raise bad_request(
            "logprobs: logprobs are supported on /v1/completions only", param="logprobs"
        )
    fmt = chat_format(req.response_format)
    policy = openai_tools(req)
    messages = from_openai(req.messages)
    if binding is not None:
        messages = binding.adapter.normalize(messages)
    stop = stop_strings(req.stop, "stop")
    kwargs, effort = req.chat_template_kwargs, req.reasoning_effort
    prompt = ctx.render(messages, policy, thinking_from_kwargs(kwargs, effort),
                        effort_from_kwargs(kwargs, effort))
    ctx.check_context(len(prompt.token_ids), "openai", "messages")
    requested = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    sampling = build_sampling(
        config=ctx.config,
        requested_max_tokens=requested,
        prompt_len=len(prompt.token_ids),
        max_model_len=ctx.engine.info.max_model_len,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=stop,
        ignore_eos=req.ignore_eos,
        logit_bias=parse_logit_bias(req.logit_bias, ctx.engine.tokenizer.vocab_size),
    )
    sampling = constrain(sampling, policy, fmt, ctx.template, prompt.in_reasoning)
    return ChatJob(
        chat_completion_id(), ctx.model_name(req.model), now(), prompt, sampling, policy, binding
    )


def finish_reason(fin: Finish, num_tool_calls: int) -> str:
    """``tool_calls`` only when calls were produced and generation stopped normally."""
    if num_tool_calls and fin.reason == "stop":
        return "tool_calls"
    return fin.reason


async def complete_chat(ctx: ServerContext, job: ChatJob) -> dict:
    """Run ``job`` to completion and build the ``chat.completion`` object.

    Raises:
        APIError: 400 when the engine rejects the request.
        EngineFailure: the engine failed mid-generation (the route answers 500).
    """
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict] = []
    fin: Finish | None = None
    async for event in ctx.events(job):
        if isinstance(event, TextDelta):
            texts.append(event.text)
        elif isinstance(event, ReasoningDelta):
            thoughts.append(event.text)
        elif isinstance(event, ToolCallEvent):
            calls.append(
                {
                    "id": openai_tool_call_id(),
                    "type": "function",
                    "function": {"name": event.name, "arguments": event.arguments},
                }
            )
        else:
            fin = event
    assert fin is not None
    content = "".join(texts)
    message: dict = {
        "role": "assistant",
        "content": None if calls and not content.strip() else content,
    }
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return {
        "id": job.request_id,
        "object": "chat.completion",
        "created": job.created,
        "model": job.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason(fin, len(calls)),
            }
        ],
        "usage": openai_usage(fin),
    }


def stream_error_event(exc: Exception) -> ServerSentEvent:
    """The ``data: {"error": {...}}`` event sent when a stream fails after its headers went out."""
    err = exc if isinstance(exc, APIError) else APIError(500, str(exc))
    return data_event(openai_error_body(err))


async def stream_chat(
    ctx: ServerContext, job: ChatJob, include_usage: bool
) -> AsyncIterator[ServerSentEvent]:
    """``chat.completion.chunk`` events of ``job``, then ``[DONE]``.

    The first chunk carries ``role``; the finish chunk has an empty delta; with
    ``include_usage`` every chunk has ``usage: null`` and a last chunk with empty ``choices``
    carries the usage. On failure an ``{"error": ...}`` event ends the stream (no ``[DONE]``);
    when the server stops it (``StreamStopped``), the error event is followed by ``[DONE]``.
    """
    base = {
        "id": job.request_id,
        "object": "chat.completion.chunk",
        "created": job.created,
        "model": job.model,
    }

    def chunk(delta: dict, reason: str | None = None) -> ServerSentEvent:
        """One ``chat.completion.chunk`` event."""
        body = {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
        }
        if include_usage:
            body["usage"] = None
        return data_event(body)

    events = ctx.events(job)
    num_calls = 0
    try:
        yield chunk({"role": "assistant", "content": ""})
        async for event in events:
            if isinstance(event, TextDelta):
                if event.text:
                    yield chunk({"content": event.text})
            elif isinstance(event, ReasoningDelta):
                if event.text:
                    yield chunk({"reasoning_content": event.text})
            elif isinstance(event, ToolCallEvent):
                head = {"index": num_calls, "id": openai_tool_call_id(), "type": "function"}
                yield chunk(
                    {"tool_calls": [{**head, "function": {"name": event.name, "arguments": ""}}]}
                )
                yield chunk(
                    {
                        "tool_calls": [
                            {"index": num_calls, "function": {"arguments": event.arguments}}
                        ]
                    }
                )
                num_calls += 1
            else:
                yield chunk({}, finish_reason(event, num_calls))
                if include_usage:
                    yield data_event({**base, "choices": [], "usage": openai_usage(event)})
        yield data_event("[DONE]")
    except StreamStopped as exc:
        yield stream_error_event(exc)
        yield data_event("[DONE]")
    except (APIError, EngineFailure) as exc:
        yield stream_error_event(exc)
    except Exception as exc:  # noqa: BLE001 - headers are out: report in-band, then close
        log.exception("chat stream %s failed", job.request_id)
        yield stream_error_event(APIError(500, f"internal error: {exc}"))
    finally:
        await close_quietly(events)
