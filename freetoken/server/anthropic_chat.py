"""``/v1/messages``: request → :class:`ChatJob`, and the job's output as a ``message`` object or as
the Anthropic SSE event sequence (docs.anthropic.com "Messages" / "Streaming Messages"):

``message_start`` (once the engine admitted the request; ``usage`` splits the prompt into
``cache_read_input_tokens`` and ``input_tokens``) → ``ping`` → content blocks (see
:mod:`freetoken.server.anthropic_blocks`) → ``message_delta`` (``stop_reason``,
``stop_sequence``, cumulative ``usage``) → ``message_stop``; a failure after the headers went out
ends the stream with an ``error`` event.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent

from freetoken.server.anthropic_blocks import BlockBuilder
from freetoken.server.anthropic_protocol import EFFORTS, CountTokensRequest, MessagesRequest
from freetoken.server.context import ChatJob, ServerContext, now
from freetoken.server.errors import APIError, anthropic_error_body, bad_request
from freetoken.server.generation import (
    Admitted,
    EngineFailure,
    Finish,
    close_quietly,
    flag_slow_start,
)
from freetoken.server.ids import message_id
from freetoken.server.messages import from_anthropic
from freetoken.server.prompt import Prompt, harmony_effort
from freetoken.server.sampling import build_sampling, stop_strings
from freetoken.server.streaming import named_event
from harness_adapters import HarnessAdapter
from freetoken.server.sessions import HarnessBinding
from freetoken.server.structured import anthropic_format, constrain
from freetoken.server.tools import ToolPolicy, anthropic_tools

log = logging.getLogger("freetoken.server")


def enable_thinking(req: CountTokensRequest) -> bool:
    """Thinking is on only when requested (``enabled`` or ``adaptive``); off when absent, as on
    Anthropic's API (enabling it unasked is ollama/ollama#15287)."""
    return req.thinking is not None and req.thinking.type != "disabled"


_BUDGET_LOW, _BUDGET_HIGH = 4096, 16384
"""``budget_tokens`` below the first is ``low`` effort, from the second on ``high`` (FreeToken's
own cut points: Claude Code asks 31999 for its deepest thinking)."""


def check_effort(req: CountTokensRequest) -> None:
    """Reject an ``output_config.effort`` that is not one of Anthropic's levels (also when
    thinking is off, where it is otherwise unused).

    Raises:
        APIError: 400 naming the field and the allowed levels.
    """
    config = req.output_config if isinstance(req.output_config, dict) else {}
    if config.get("effort") is not None and config["effort"] not in EFFORTS:
        levels = ", ".join(f"'{e}'" for e in EFFORTS[:-1]) + f" or '{EFFORTS[-1]}'"
        raise bad_request(f"output_config.effort: Input should be {levels}",
                          param="output_config.effort")


INTERLEAVED_THINKING_BETA = "interleaved-thinking-"
"""Prefix of the ``anthropic-beta`` flag (``interleaved-thinking-2025-05-14``) under which a
thinking budget spans the whole turn and may exceed ``max_tokens``."""


def check_thinking_budget(req: MessagesRequest, beta: str | None) -> None:
    """Reject an ``enabled`` thinking whose ``budget_tokens`` is not below ``max_tokens``, as
    Anthropic's API does (thinking counts toward ``max_tokens``), unless ``beta`` (the
    ``anthropic-beta`` header, comma-separated flags) turns on interleaved thinking.

    Raises:
        APIError: 400 ``invalid_request_error`` with the API's own message.
    """
    thinking = req.thinking
    if thinking is None or thinking.type != "enabled" or thinking.budget_tokens is None:
        return
    if any(f.strip().startswith(INTERLEAVED_THINKING_BETA) for f in (beta or "").split(",")):
        return
    if thinking.budget_tokens >= req.max_tokens:
        raise bad_request(
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
            "documentation at https://docs.claude.com/en/docs/build-with-claude/"
            "extended-thinking#max-tokens-and-context-window-size",
            param="max_tokens",
        )


def reasoning_effort(req: CountTokensRequest) -> str | None:
    """The harmony reasoning level a request asks for, or None (the template's default).

    With thinking off, None: the template then takes the lowest level from
    ``enable_thinking=False``. With it on, ``output_config.effort`` (``low`` / ``medium`` /
    ``high`` / ``max``, through ``harmony_effort``) wins, else an ``enabled`` thinking's
    ``budget_tokens`` (below 4096 ``low``, below 16384 ``medium``, else ``high``).
    """
    if not enable_thinking(req):
        return None
    config = req.output_config if isinstance(req.output_config, dict) else {}
    effort = harmony_effort(config.get("effort"))
    budget = req.thinking.budget_tokens
    if effort is None and req.thinking.type == "enabled" and isinstance(budget, int):
        effort = "low" if budget < _BUDGET_LOW else "medium" if budget < _BUDGET_HIGH else "high"
    return effort


def render_request(
    ctx: ServerContext, req: CountTokensRequest, adapter: HarnessAdapter | None = None
) -> tuple[Prompt, ToolPolicy]:
    """Render a Messages (or count_tokens) request; returns the prompt and its tool policy.
    ``adapter`` (the request's harness) normalises the messages before templating.

    Raises:
        APIError: 400 for bad blocks, tools or template errors.
    """
    check_effort(req)
    policy = anthropic_tools(req)
    messages = from_anthropic(req.system, req.messages)
    if adapter is not None:
        messages = adapter.normalize(messages)
    return ctx.render(messages, policy, enable_thinking(req), reasoning_effort(req)), policy


def prepare_messages(
    ctx: ServerContext, req: MessagesRequest, binding: HarnessBinding | None = None
) -> ChatJob:
    """Validate, render and tokenize a Messages request and clamp its sampling parameters.

    Raises:
        APIError: 400 for bad input (a bad ``output_config.format`` / ``output_format``: see
            :mod:`freetoken.server.structured`), template errors or ``prompt is too long: N
            tokens > M maximum``.
    """
    stop = stop_strings(req.stop_sequences, "stop_sequences")
    fmt = anthropic_format(req.output_config, req.output_format)
    prompt, policy = render_request(ctx, req, binding.adapter if binding is not None else None)
    ctx.check_context(len(prompt.token_ids), "anthropic", "messages")
    sampling = build_sampling(
        config=ctx.config,
        requested_max_tokens=req.max_tokens,
        prompt_len=len(prompt.token_ids),
        max_model_len=ctx.engine.info.max_model_len,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=stop,
        ignore_eos=req.ignore_eos,
    )
    sampling = constrain(sampling, policy, fmt, ctx.template, prompt.in_reasoning)
    return ChatJob(
        message_id(), ctx.model_name(req.model), now(), prompt, sampling, policy, binding
    )


def stop_fields(fin: Finish, num_tool_uses: int) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)``: ``max_tokens`` on length; ``tool_use`` when a tool was
    called; ``stop_sequence`` with the matched string; else ``end_turn``."""
    if fin.reason == "length":
        return "max_tokens", None
    if num_tool_uses:
        return "tool_use", None
    if fin.matched_stop_string is not None:
        return "stop_sequence", fin.matched_stop_string
    return "end_turn", None


def anthropic_usage(fin: Finish) -> dict:
    """Anthropic ``usage``: ``input_tokens`` excludes cache reads (their sum is the prompt)."""
    return {
        "input_tokens": fin.prompt_tokens - fin.cached_tokens,
        "output_tokens": fin.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": fin.cached_tokens,
    }


def _message(
    job: ChatJob, content: list[dict], stop: tuple[str | None, str | None], usage: dict
) -> dict:
    return {
        "id": job.request_id,
        "type": "message",
        "role": "assistant",
        "model": job.model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage,
    }


async def complete_message(ctx: ServerContext, job: ChatJob) -> dict:
    """Run ``job`` and build the ``message`` object.

    Raises:
        APIError: 400 when the engine rejects the request.
        EngineFailure: the engine failed mid-generation.
    """
    builder = BlockBuilder()
    fin: Finish | None = None
    async for event in ctx.events(job):
        if isinstance(event, Finish):
            fin = event
        else:
            builder.feed(event)
    builder.close()
    assert fin is not None
    return _message(
        job, builder.blocks, stop_fields(fin, builder.num_tool_uses), anthropic_usage(fin)
    )


def _start_usage(prompt_tokens: int, cached_tokens: int) -> dict:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
    }


async def stream_message(ctx: ServerContext, job: ChatJob) -> AsyncIterator[ServerSentEvent]:
    """The SSE events of ``job`` in the documented order (see module docstring).

    ``message_start`` goes out once the engine admitted the request (before its prefill), so its
    usage splits the prompt into ``cache_read_input_tokens`` and recomputed ``input_tokens``
    (Claude Code's context meter reads it there). A request still queued after half a ping
    interval, or an engine that reports no admission, gets the whole prompt as ``input_tokens``
    (``message_start`` always comes before any ping).
    """
    events = ctx.events(job, report_admission=True)
    paced = flag_slow_start(events, ctx.config.ping_interval_s / 2)
    builder = BlockBuilder()
    started = False
    try:
        fin: Finish | None = None
        async for event in paced:
            if not started:
                cached = event.cached_tokens if isinstance(event, Admitted) else 0
                usage = _start_usage(len(job.prompt.token_ids), cached)
                yield named_event(
                    {"type": "message_start", "message": _message(job, [], (None, None), usage)}
                )
                yield named_event({"type": "ping"})
                started = True
            if event is None or isinstance(event, Admitted):
                continue
            if isinstance(event, Finish):
                fin = event
                continue
            for payload in builder.feed(event):
                yield named_event(payload)
        for payload in builder.close():
            yield named_event(payload)
        assert fin is not None
        reason, sequence = stop_fields(fin, builder.num_tool_uses)
        yield named_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": anthropic_usage(fin),
            }
        )
        yield named_event({"type": "message_stop"})
    except (APIError, EngineFailure) as exc:
        err = exc if isinstance(exc, APIError) else APIError(500, str(exc))
        yield named_event(anthropic_error_body(err))
    except Exception as exc:  # noqa: BLE001 - headers are out: report in-band, then close
        log.exception("messages stream %s failed", job.request_id)
        yield named_event(anthropic_error_body(APIError(500, f"internal error: {exc}")))
    finally:
        await close_quietly(paced)
        await close_quietly(events)
