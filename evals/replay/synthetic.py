"""The built-in synthetic trace set: a small traces folder in the layout and line schema of
../shared/traces (traces/README.md), written by code so ``evals/run.py`` runs where the shared
traces are absent. Every text is generated here from project-written templates (no third-party
text); the same call always writes the same files.

Contents (file names pick the harness adapter exactly as for the real traces):

* ``W1_math_aime/synthetic_math.jsonl``: 8 single-turn modular-arithmetic problems, no response.
* ``W2_coding_agent_swebench/sweagent_synthetic_fix.jsonl``: a 10-call text-action agent loop
  whose observations have 3 + k lines (SWE-agent's last-5 elision starts at call 6);
  ``minisweagent_synthetic.jsonl``: 3 calls.
* ``W2_coding_agent_opencode/opencode_synthetic__session{1,2}.jsonl``: a 4-call tool loop with
  OpenCode-shaped usage and a ``task`` call at call 1, and its 2-call child session.
* ``W3_claude_code/cc_synthetic__main.jsonl`` + ``__subagent01/02``: Anthropic blocks; main call 1
  spawns two Task sub-agents (3 calls each, ``meta.parent_task_tool_use_id``), main call 2 reads
  their results.
* ``W4_openclaw_assistant/openclaw_openai.jsonl`` (a generated assistant system prompt with a
  ``Runtime: ... repo=...`` line and 5 tools) and ``W4_fixtures/synthetic_mailbox_calendar.json``
  / ``synthetic_user_prompts.json`` (10 events, 10 emails, 8 calendar + 7 email prompts).
"""

from __future__ import annotations

import json
from pathlib import Path

_NAMES = ("ada", "bo", "cyd", "dee", "eli", "fay", "gus", "hal", "ivy", "jo")
_PLACES = ("room 1", "room 2", "the cafe", "the lab", "the park")
_TOPICS = ("budget", "roadmap", "hiring", "launch", "review", "offsite", "training", "audit",
           "design", "support")


def _write(path: Path, lines: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def _loop(history: list[dict], replies: list[dict], after: list[list[dict]], meta: dict
          ) -> list[dict]:
    """Trace lines of a tool loop: line k sends the history so far, replies[k], then after[k]."""
    lines = []
    history = list(history)
    for k, reply in enumerate(replies):
        line = {"turn": k, "messages": list(history), "response": reply}
        if k == 0:
            line["meta"] = meta
        lines.append(line)
        history += [{kk: v for kk, v in reply.items() if kk != "usage"}] + after[k]
    return lines


def _w1() -> list[dict]:
    lines = []
    for k in range(8):
        a, b, m = 7 + 3 * k, 11 + 5 * k, 97 + 10 * k
        lines.append({"turn": k, "messages": [{"role": "user", "content": (
            f"Problem {k + 1}. Compute the remainder of {a} raised to the power {b} when divided "
            f"by {m}. Show the reasoning, then give the final answer as an integer.")}],
            "response": None, "meta": {"reference_answer": str(pow(a, b, m)),
                                       "protocol": "any (plain user message)"}})
    return lines


def _sweagent() -> list[dict]:
    system = ("You are a programmer agent working in a shell on a repository. Every reply has "
              "one short thought and one command in a fenced block. The shell prints the "
              "command's output back to you.")
    task = ("Fix this bug: the function mean() in stats.py divides by zero when it gets an empty "
            "list. Make it return 0.0 for an empty list and keep other results unchanged.")
    replies, after = [], []
    for k in range(10):
        replies.append({"role": "assistant", "content": (
            f"Step {k}: I will inspect part {k} of the code.\n```\nsed -n {10 * k},"
            f"{10 * k + 9}p src/stats_{k}.py\n```")})
        out = "\n".join(f"{10 * k + j}: value_{j} = compute({j}, {k})" for j in range(3 + k))
        after.append([{"role": "user", "content": out}])
    return _loop([{"role": "system", "content": system}, {"role": "user", "content": task}],
                 replies, after, {"protocol": "openai-chat (text actions in content)"})


def _mini() -> list[dict]:
    replies, after = [], []
    for k in range(3):
        text = f"Listing step {k}.\n```bash\nls dir_{k}\n```"
        replies.append({"role": "assistant", "content": text})
        after.append([{"role": "user", "content": f"file_{k}_a.py\nfile_{k}_b.py"}])
    return _loop([{"role": "system", "content": "You run one bash command per reply."},
                  {"role": "user", "content": "Count the python files in every directory."}],
                 replies, after, {"protocol": "openai-chat (text actions in content)"})


def _opencode(session: int, calls: int) -> list[dict]:
    replies, after = [], []
    for k in range(calls):
        name = "task" if (session == 1 and k == 1) else "read"
        cid = f"call_oc{session}_{k}"
        args = {"prompt": "summarise the notes folder"} if name == "task" \
            else {"filePath": f"notes/n{k}.md"}
        replies.append({"role": "assistant", "content": f"Reading note {k}." if k % 2 else None,
                        "tool_calls": [{"id": cid, "type": "function", "function": {
                            "name": name, "arguments": json.dumps(args)}}],
                        "usage": {"tokens": {"input": 5, "output": 20 + 7 * k, "reasoning": 3,
                                             "cache": {"write": 0, "read": 0}}}})
        after.append([{"role": "tool", "tool_call_id": cid,
                       "content": f"note {k}: " + " ".join(_TOPICS[: 3 + k])}])
    return _loop([{"role": "user", "content": f"Session {session}: tidy up the notes folder."}],
                 replies, after, {"protocol": "openai-chat+tool_calls (reconstructed)"})


def _anthropic_reply(text: str, uses: list[tuple[str, str, dict]], out_tokens: int) -> dict:
    blocks = [{"type": "text", "text": text}] + [
        {"type": "tool_use", "id": uid, "name": name, "input": inp} for uid, name, inp in uses]
    return {"role": "assistant", "content": blocks,
            "usage": {"input_tokens": 3, "cache_read_input_tokens": 0, "output_tokens": out_tokens}}


def _results(uses: list[tuple[str, str, dict]], texts: list[str]) -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": uid, "content": text}
        for (uid, _, _), text in zip(uses, texts)]}]


def _w3_main() -> list[dict]:
    uses0 = [("toolu_syn_glob", "Glob", {"pattern": "**/*.md"})]
    uses1 = [("toolu_syn_task_a", "Task", {"description": "write docs", "prompt": "Write docs."}),
             ("toolu_syn_task_b", "Task", {"description": "write tests", "prompt": "Write tests."})]
    replies = [_anthropic_reply("I will look for existing notes first.", uses0, 40),
               _anthropic_reply("Two independent parts: I start two agents.", uses1, 90),
               _anthropic_reply("Both parts are done; the project has docs and tests.", [], 25)]
    after = [_results(uses0, ["README.md\nNOTES.md"]),
             _results(uses1, ["Docs written in docs/.", "Tests written in tests/."]), []]
    first = {"role": "user", "content": [{"type": "text", "text": "Add docs and tests."}]}
    return _loop([first], replies, after, {"protocol": "anthropic-messages"})


def _w3_sub(n: int, parent: str) -> list[dict]:
    replies, after = [], []
    for k in range(3):
        write = {"file_path": f"part{n}/f{k}.txt", "content": f"part {n} file {k}"}
        uses = [(f"toolu_syn_{n}_{k}", "Write", write)] if k < 2 else []
        replies.append(_anthropic_reply(f"Agent {n}, step {k}.", uses, 30 + 10 * k))
        after.append(_results(uses, [f"Wrote part{n}/f{k}.txt"]) if uses else [])
    first = {"role": "user", "content": [{"type": "text", "text": f"Do part {n} of the work."}]}
    return _loop([first], replies, after, {"protocol": "anthropic-messages",
                                           "parent_task_tool_use_id": parent})


def _w4_capture() -> list[dict]:
    rules = "\n".join(f"- Rule {i}: keep answers about {t} short and concrete."
                      for i, t in enumerate(_TOPICS))
    system = ("You are a personal assistant for a busy user.\n## Tools\nUse read to open "
              "workspace files and exec for shell commands.\n## Rules\n" + rules +
              "\n## Runtime\nRuntime: agent=synthetic | host=local | repo=/home/user/workspace "
              "| shell=bash")
    tools = [{"type": "function", "function": {
        "name": name, "description": f"The {name} tool: {desc}.",
        "parameters": {"type": "object", "properties": {arg: {"type": "string"}},
                       "required": [arg]}}}
        for name, desc, arg in (("read", "read a file", "path"), ("write", "write a file", "path"),
                                ("edit", "edit a file", "path"),
                                ("exec", "run a command", "command"),
                                ("memory_search", "search notes", "query"))]
    return [{"turn": 0, "messages": [{"role": "system", "content": system},
                                     {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
             "tools": tools, "response": {"role": "assistant", "content": "Hello, what can I do?"},
             "meta": {"protocol": "openai-chat"}}]


def _w4_fixtures() -> tuple[dict, dict]:
    me = "user@example.com"
    events = [{"id_": str(i), "title": f"{_TOPICS[i].title()} meeting",
               "description": f"Talk about the {_TOPICS[i]} with {_NAMES[i].title()}.",
               "start_time": f"2030-03-{4 + i % 5:02d}T{9 + i % 8:02d}:00",
               "end_time": f"2030-03-{4 + i % 5:02d}T{10 + i % 8:02d}:00",
               "location": _PLACES[i % len(_PLACES)],
               "participants": [me, f"{_NAMES[i]}@example.com"]}
              for i in range(10)]
    emails = [{"id_": str(i), "sender": f"{_NAMES[i]}@example.com", "recipients": [me],
               "subject": f"Notes on the {_TOPICS[(i + 3) % 10]}",
               "body": f"Hi, here are my notes on the {_TOPICS[(i + 3) % 10]}. "
                       f"Code {1000 + 37 * i}.",
               "timestamp": f"2030-03-0{1 + i % 3}T{8 + i:02d}:15:00"} for i in range(10)]
    fixture = {"inbox": {"account_email": me, "initial_emails": emails},
               "calendar": {"account_email": me, "current_day": "2030-03-04",
                            "initial_events": events}}
    prompts = [{"task": f"Cal{i}", "prompt": f"When is my {_TOPICS[i]} meeting, and where?",
                "ground_truth_output": events[i]["start_time"] if i % 2 else None}
               for i in range(8)]
    prompts += [{"task": f"Mail{i}", "prompt": f"What do the emails say about the "
                 f"{_TOPICS[(i + 3) % 10]}?", "ground_truth_output": None} for i in range(7)]
    return fixture, {"prompts": prompts}


def write_synthetic_traces(root: Path) -> Path:
    """Write the synthetic trace set under ``root`` (created; existing files overwritten) and
    return ``root``."""
    _write(root / "W1_math_aime" / "synthetic_math.jsonl", _w1())
    swe = root / "W2_coding_agent_swebench"
    _write(swe / "sweagent_synthetic_fix.jsonl", _sweagent())
    _write(swe / "minisweagent_synthetic.jsonl", _mini())
    oc = root / "W2_coding_agent_opencode"
    _write(oc / "opencode_synthetic__session1.jsonl", _opencode(1, 4))
    _write(oc / "opencode_synthetic__session2.jsonl", _opencode(2, 2))
    w3 = root / "W3_claude_code"
    _write(w3 / "cc_synthetic__main.jsonl", _w3_main())
    _write(w3 / "cc_synthetic__subagent01.jsonl", _w3_sub(1, "toolu_syn_task_a"))
    _write(w3 / "cc_synthetic__subagent02.jsonl", _w3_sub(2, "toolu_syn_task_b"))
    _write(root / "W4_openclaw_assistant" / "openclaw_openai.jsonl", _w4_capture())
    fixture, prompts = _w4_fixtures()
    fixtures = root / "W4_fixtures"
    fixtures.mkdir(parents=True, exist_ok=True)
    (fixtures / "synthetic_mailbox_calendar.json").write_text(json.dumps(fixture, indent=1))
    (fixtures / "synthetic_user_prompts.json").write_text(json.dumps(prompts, indent=1))
    return root
