"""The endpoint an agent is pointed at: base URL, model name, key and token limits, all resolved."""

from __future__ import annotations

from dataclasses import dataclass

from freetoken.agents.discover import ServedModel

DEFAULT_API_KEY = "freetoken"  # a non-secret marker: FreeToken without --api-key accepts any key
DEFAULT_CONTEXT_WINDOW = 32768  # tokens, used when the model card states no context length
DEFAULT_MAX_OUTPUT_TOKENS = 4096  # tokens, FreeToken's default --max-output-tokens


@dataclass(frozen=True)
class Target:
    """What every agent config is built from.

    ``base_url`` has no trailing slash and no ``/v1`` (Claude Code appends ``/v1/messages``
    itself; the OpenAI-style clients get ``openai_base_url``). ``context_window`` and
    ``max_output_tokens`` are token counts.
    """

    base_url: str
    model: str
    api_key: str
    context_window: int
    max_output_tokens: int

    @property
    def openai_base_url(self) -> str:
        """``{base_url}/v1``: where OpenAI SDKs append ``/chat/completions``."""
        return f"{self.base_url}/v1"


def resolve_target(served: ServedModel, api_key: str | None = None) -> tuple[Target, list[str]]:
    """``served`` with defaults for what the server did not state; also returns one note per default.

    ``api_key`` None means ``DEFAULT_API_KEY`` (clients refuse an empty key); a missing context
    length becomes ``DEFAULT_CONTEXT_WINDOW`` and a missing output cap ``DEFAULT_MAX_OUTPUT_TOKENS``.
    """
    notes = []
    context = served.context_window
    if context is None:
        context = DEFAULT_CONTEXT_WINDOW
        notes.append(f"the model card of {served.name!r} states no context length; assuming {context} tokens")
    output = served.max_output_tokens
    if output is None:
        output = DEFAULT_MAX_OUTPUT_TOKENS
        notes.append(f"the model card of {served.name!r} states no output cap (max_tokens); "
                     f"assuming {output} tokens")
    return Target(served.server, served.name, api_key or DEFAULT_API_KEY, context, output), notes
