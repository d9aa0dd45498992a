"""Run a coding agent (Claude Code, OpenCode, OpenClaw, mini-swe-agent, Codex) against a FreeToken
server.

``freetoken launch AGENT`` discovers the served model (``discover``), resolves the endpoint and its
token limits (``target``), builds the agent's provider settings with pure functions (one module per
agent), clears cloud credentials from the child environment (``environment``), assembles the whole
launch (``plan``) and either prints it (``--dry-run``) or writes the config file and execs the agent
(``launch``).

The settings follow the hands-on client recipes and harness notes of the research folder
(``real-clients.md`` sections 3-6, ``harnesses.md`` sections 1a, 2a, 4a, 5a), including the ones that
keep the server's prefix cache intact across turns and sessions (Claude Code's attribution header
off, OpenClaw's ``reasoning: true``).
"""

from freetoken.agents.discover import DiscoveryError, ServedModel, discover
from freetoken.agents.plan import AGENTS, AgentSpec, LaunchPlan, plan_launch
from freetoken.agents.target import Target, resolve_target

__all__ = [
    "AGENTS", "AgentSpec", "DiscoveryError", "LaunchPlan", "ServedModel", "Target", "discover",
    "plan_launch", "resolve_target",
]
