"""The child environment of a launched agent: the caller's, minus cloud credentials, plus the agent's
settings.

Every cloud credential and cloud-routing switch the agents (or litellm, the AI SDK, pi-ai) read is
removed, so a launched agent can only talk to the FreeToken server and never spends a cloud key by
fallback (a title model, a sub-agent, a provider picked from the environment). The names are the
ones those clients document, plus the ones found in the Claude Code 2.1.197 binary. Generic
settings that are not credentials (``AWS_REGION``, ``GOOGLE_CLOUD_PROJECT``, proxies) are kept:
the agent's own tools (git, cloud CLIs) may need them.
"""

from __future__ import annotations

from collections.abc import Mapping

CLOUD_CREDENTIALS = (
    # Anthropic, and Claude Code's routes to other clouds
    "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY", "CLAUDE_CODE_USE_MANTLE",
    "ANTHROPIC_BEDROCK_BASE_URL", "ANTHROPIC_BEDROCK_MANTLE_API_KEY", "ANTHROPIC_BEDROCK_MANTLE_BASE_URL",
    "ANTHROPIC_AWS_API_KEY", "ANTHROPIC_VERTEX_PROJECT_ID", "ANTHROPIC_VERTEX_BASE_URL",
    "ANTHROPIC_FOUNDRY_API_KEY", "ANTHROPIC_FOUNDRY_BASE_URL", "ANTHROPIC_FOUNDRY_RESOURCE",
    # OpenAI and Azure OpenAI
    "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_ORG_ID", "OPENAI_ORGANIZATION",
    "OPENAI_PROJECT_ID", "AZURE_OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT", "AZURE_API_KEY", "AZURE_API_BASE",
    "AZURE_AI_API_KEY", "AZURE_RESOURCE_NAME",
    # Google Gemini / Vertex AI
    "GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENERATIVE_AI_API_KEY", "GOOGLE_APPLICATION_CREDENTIALS",
    "VERTEXAI_PROJECT", "VERTEX_PROJECT",
    # AWS (Bedrock)
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK",
    # routers and gateways
    "OPENROUTER_API_KEY", "PORTKEY_API_KEY", "REQUESTY_API_KEY", "AI_GATEWAY_API_KEY", "OPENCODE_API_KEY",
    # other hosted model APIs
    "MISTRAL_API_KEY", "GROQ_API_KEY", "DEEPSEEK_API_KEY", "XAI_API_KEY", "TOGETHER_API_KEY",
    "TOGETHERAI_API_KEY", "FIREWORKS_API_KEY", "FIREWORKS_AI_API_KEY", "CEREBRAS_API_KEY", "COHERE_API_KEY",
    "CO_API_KEY", "PERPLEXITY_API_KEY", "PERPLEXITYAI_API_KEY", "MOONSHOT_API_KEY", "DASHSCOPE_API_KEY",
    "ZAI_API_KEY", "ZHIPUAI_API_KEY", "MINIMAX_API_KEY", "NVIDIA_API_KEY", "NVIDIA_NIM_API_KEY",
    "HUGGINGFACE_API_KEY", "REPLICATE_API_KEY", "REPLICATE_API_TOKEN", "OLLAMA_API_KEY",
)


def child_environment(parent: Mapping[str, str], settings: Mapping[str, str]) -> tuple[dict[str, str],
                                                                                        tuple[str, ...]]:
    """The agent's environment: ``parent`` without ``CLOUD_CREDENTIALS``, then ``settings`` on top.

    Returns ``(env, cleared)``; ``cleared`` names the credentials that were present in ``parent``
    and are now absent (a name the agent's ``settings`` set again is not listed), in
    ``CLOUD_CREDENTIALS`` order. Values of cleared variables appear nowhere in the result.
    """
    env = {k: v for k, v in parent.items() if k not in CLOUD_CREDENTIALS}
    env.update(settings)
    cleared = tuple(k for k in CLOUD_CREDENTIALS if k in parent and k not in settings)
    return env, cleared


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def proxy_bypass(parent: Mapping[str, str], host: str) -> dict[str, str]:
    """``NO_PROXY``/``no_proxy`` settings that keep a loopback ``host`` off the caller's proxy.

    Empty when ``parent`` sets no proxy variable (nothing to bypass). Otherwise both spellings get
    the union of their current entries and ``host`` (order kept, no duplicates), since Node, Bun and
    Python clients each read a different one.
    """
    if not any(parent.get(k) for k in PROXY_VARIABLES):
        return {}
    entries: list[str] = []
    for name in ("NO_PROXY", "no_proxy"):
        entries += [e.strip() for e in parent.get(name, "").split(",") if e.strip()]
    entries.append(host)
    merged = ",".join(dict.fromkeys(entries))
    return {"NO_PROXY": merged, "no_proxy": merged}
