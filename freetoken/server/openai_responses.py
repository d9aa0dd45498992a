"""``/v1/responses``: request → :class:`ResponseJob` (a chat job plus what the response echoes),
and the job's output as a ``response`` object or as the Responses SSE event sequence.

Generation is the chat path's: the input items become template messages
(:mod:`freetoken.server.openai_responses_input`), then the same rendering, context check,
sampling, tool grammar, engine stream and output parser. Output items: see
:mod:`freetoken.server.openai_responses_items`.

Stream: ``response.created`` and ``response.in_progress`` (status ``in_progress``, no output) →
the items' events → ``response.completed``, or ``response.incomplete`` when ``max_output_tokens``
(or the context) cut generation (``incomplete_details.reason: max_output_tokens``). Every event
is ``event: <type>`` + ``data: {"type", "sequence_number" (0, 1, ...), ...}``. A failure after the
headers went out ends the stream with ``response.failed`` (``error: {code, message}``).
Completed and incomplete responses are stored unless ``store`` is false.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sse_starlette import ServerSentEvent

from freetoken.server.context import ChatJob, ServerContext, now
from freetoken.server.errors import APIError, bad_request
from freetoken.server.generation import EngineFailure, Finish, close_quietly
from freetoken.server.ids import response_id
from freetoken.server.openai_responses_input import input_messages
from freetoken.server.openai_responses_items import OutputBuilder
from freetoken.server.openai_responses_protocol import ResponsesRequest
from freetoken.server.openai_responses_input_items import with_item_ids
from freetoken.server.openai_responses_store import ResponseStore, StoredResponse
from freetoken.server.openai_responses_tools import ResponsesToolset, read_tools
from freetoken.server.prompt import effort_from_kwargs, thinking_from_kwargs
from freetoken.server.sampling import build_sampling
from freetoken.server.sessions import HarnessBinding
from freetoken.server.streaming import named_event
from freetoken.server.structured import constrain, responses_format
from freetoken.server.tools import responses_tools

log = logging.getLogger("freetoken.server")


@dataclass(frozen=True)
class ResponseJob:
    """One Responses request, ready for the engine.

    Attributes:
        chat: the chat job generating it (its ``request_id`` is the ``resp_…`` id).
        request: the validated request (echoed in the response object).
        conversation: the stored conversation it continues plus its own input items (each
            with an ``id``, see ``openai_responses_input_items.with_item_ids``).
        toolset: the declared tools as the model sees them (custom tool names included).
    """

    chat: ChatJob
    request: ResponsesRequest
    conversation: tuple[dict, ...]
    toolset: ResponsesToolset = ResponsesToolset()


def _input_items(req: ResponsesRequest) -> list[dict]:
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    return list(req.input or [])


def prepare_response(
    ctx: ServerContext, req: ResponsesRequest, store: ResponseStore,
    binding: HarnessBinding | None = None,
) -> ResponseJob:
    """Validate, render and tokenize a Responses request and clamp its sampling parameters.

    ``instructions`` become the first (system) message; a ``previous_response_id`` puts the
    stored conversation before ``input`` (its instructions are not inherited).

    Raises:
        APIError: 400 for ``conversation``, a bad ``text.format``
            (:mod:`freetoken.server.structured`), an unknown
            ``previous_response_id`` (code ``previous_response_not_found``), a missing or
            (without a previous response) empty ``input``, bad items or tools, template
            errors, or a prompt that does not fit the context (``context_length_exceeded``,
            param ``input``).
    """
    if req.conversation is not None:
        raise bad_request("conversation: conversations are not supported; use "
                          "previous_response_id", param="conversation")
    fmt = responses_format(req.text.format if req.text is not None else None)
    history: tuple[dict, ...] = ()
    if req.previous_response_id is not None:
        stored = store.get(req.previous_response_id)
        if stored is None:
            raise bad_request(
                f"Previous response with id '{req.previous_response_id}' not found.",
                param="previous_response_id", code="previous_response_not_found",
            )
        history = stored.conversation
    if req.input is None and not history:
        raise bad_request("input: Field required", param="input")
    if req.input == [] and not history:
        raise bad_request("input: List should have at least 1 item after validation, not 0",
                          param="input")
    items = _input_items(req)
    toolset = read_tools(req.tools)
    if toolset.dropped:
        log.info("responses: tools not offered to the model (not runnable as functions): %s",
                 ", ".join(toolset.dropped))
    policy = responses_tools(req, toolset.functions)
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    input_messages(history, "previous_response_id", messages)
    input_messages(items, "input", messages)
    if binding is not None:
        messages = binding.adapter.normalize(messages)
    effort = req.reasoning.effort if req.reasoning is not None else None
    prompt = ctx.render(messages, policy, thinking_from_kwargs(None, effort),
                        effort_from_kwargs(None, effort))
    ctx.check_context(len(prompt.token_ids), "openai", "input")
    sampling = build_sampling(
        config=ctx.config,
        requested_max_tokens=req.max_output_tokens,
        prompt_len=len(prompt.token_ids),
        max_model_len=ctx.engine.info.max_model_len,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=(),
        ignore_eos=req.ignore_eos,
    )
    sampling = constrain(sampling, policy, fmt, ctx.template, prompt.in_reasoning)
    chat = ChatJob(response_id(), ctx.model_name(req.model), now(), prompt, sampling, policy,
                   binding)
    return ResponseJob(chat, req, history + with_item_ids(items), toolset)


def responses_usage(ctx: ServerContext, fin: Finish, reasoning: str) -> dict:
    """Responses ``usage``; ``reasoning_tokens`` counts the reasoning text's tokens (the parser
    reports text, not token ids), at most the output tokens."""
    thought = min(len(ctx.engine.tokenizer.encode(reasoning)), fin.completion_tokens)
    return {
        "input_tokens": fin.prompt_tokens,
        "input_tokens_details": {"cached_tokens": fin.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": fin.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": thought},
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
    }


def echoed_format(req: ResponsesRequest) -> dict:
    """``text.format`` as the response echoes it: the request's (validated) format, or text."""
    fmt = req.text.format if req.text is not None else None
    return dict(fmt) if fmt else {"type": "text"}


def response_object(job: ResponseJob, status: str, output: list[dict],
                    usage: dict | None = None, error: dict | None = None) -> dict:
    """The ``response`` object of ``job`` in ``status`` (``in_progress``, ``completed``,
    ``incomplete``, ``failed``), echoing the request's settings."""
    req, sampling = job.request, job.chat.sampling
    choice = req.tool_choice
    return {
        "id": job.chat.request_id,
        "object": "response",
        "created_at": job.chat.created,
        "status": status,
        "completed_at": now() if status == "completed" else None,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "model": job.chat.model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {
            "effort": req.reasoning.effort if req.reasoning else None,
            "summary": req.reasoning.summary if req.reasoning else None,
        },
        "store": req.store,
        "temperature": sampling.temperature,
        "text": {"format": echoed_format(req)},
        "tool_choice": "auto" if choice is None else (
            choice if isinstance(choice, str) else choice.model_dump()),
        "tools": list(req.tools or []),
        "top_p": sampling.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": req.user,
    }


def _finish(ctx: ServerContext, job: ResponseJob, builder: OutputBuilder, fin: Finish,
            store: ResponseStore) -> tuple[list[dict], dict]:
    """Close the builder; returns its closing payloads and the final response (stored unless
    ``store`` is false)."""
    status = "incomplete" if fin.reason == "length" else "completed"
    closing = builder.close(status)
    body = response_object(job, status, builder.items, responses_usage(ctx, fin, builder.reasoning))
    if job.request.store:
        store.put(body["id"], StoredResponse(body, job.conversation + tuple(builder.items)))
    return closing, body


async def complete_response(ctx: ServerContext, job: ResponseJob, store: ResponseStore) -> dict:
    """Run ``job`` to completion and build the ``response`` object.

    Raises:
        APIError: 400 when the engine rejects the request.
        EngineFailure: the engine failed mid-generation (the route answers 500).
    """
    builder = OutputBuilder(job.toolset.custom)
    fin: Finish | None = None
    async for event in ctx.events(job.chat):
        if isinstance(event, Finish):
            fin = event
        else:
            builder.feed(event)
    assert fin is not None
    return _finish(ctx, job, builder, fin, store)[1]


def _failure(exc: Exception) -> dict:
    err = exc if isinstance(exc, APIError) else APIError(500, str(exc))
    code = "server_error" if err.status >= 500 else "invalid_prompt"
    return {"code": code, "message": err.message}


async def stream_response(ctx: ServerContext, job: ResponseJob,
                          store: ResponseStore) -> AsyncIterator[ServerSentEvent]:
    """The SSE events of ``job`` in the documented order (see module docstring)."""
    numbers = itertools.count()

    def event(payload: dict) -> ServerSentEvent:
        return named_event({**payload, "sequence_number": next(numbers)})

    events = ctx.events(job.chat)
    builder = OutputBuilder(job.toolset.custom)
    try:
        start = response_object(job, "in_progress", [])
        yield event({"type": "response.created", "response": start})
        yield event({"type": "response.in_progress", "response": start})
        fin: Finish | None = None
        async for item in events:
            if isinstance(item, Finish):
                fin = item
                continue
            for payload in builder.feed(item):
                yield event(payload)
        assert fin is not None
        closing, body = _finish(ctx, job, builder, fin, store)
        for payload in closing:
            yield event(payload)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        yield event({"type": kind, "response": body})
    except (APIError, EngineFailure) as exc:
        yield event({"type": "response.failed",
                     "response": response_object(job, "failed", builder.items,
                                                 error=_failure(exc))})
    except Exception as exc:  # noqa: BLE001 - headers are out: report in-band, then close
        log.exception("responses stream %s failed", job.chat.request_id)
        failure = _failure(APIError(500, f"internal error: {exc}"))
        yield event({"type": "response.failed",
                     "response": response_object(job, "failed", builder.items, error=failure)})
    finally:
        await close_quietly(events)
