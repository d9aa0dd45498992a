"""Per-harness knowledge (Claude Code, OpenCode, OpenClaw, SWE-agent): detection, edit boundaries,
prefix-buster normalisation and edit simulators. Populated by the harness-adapter issue."""
