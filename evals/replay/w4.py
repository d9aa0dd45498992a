"""W4: a 13-turn OpenClaw email/calendar session assembled from the traces folder.

No recorded OpenClaw session talks about mail or a calendar (traces/README.md, known gaps), so
the session is composed at run time; nothing of the traces is stored in the repository. The
recipe (also in evals/README.md, "W1-W4 replay"):

1. **System prompt and tools**: the real OpenClaw system prompt (``messages[0]``, ~26k characters
   with the injected workspace files) and its 23 tool schemas from the last line of
   ``W4_openclaw_assistant/openclaw_openai.jsonl`` (OpenAI chat capture), verbatim. The
   workspace path is the ``repo=`` field of the prompt's ``Runtime:`` line.
2. **User turns**: from ``W4_fixtures/*user_prompts.json``, the prompts that need neither the
   cloud drive nor a file (no ``file``/``drive``/``.docx``/``.xlsx``), split into email prompts
   (they mention ``email(s)`` other than as "email address") and calendar prompts, then taken
   alternately, calendar first, in file order, until 13.
3. **Mailbox/calendar content**: ``W4_fixtures/*mailbox_calendar.json``. The first turn that
   needs the calendar (calendar prompts, and email prompts that mention an event, the calendar
   or appointments) starts with an assistant call of OpenClaw's ``read`` tool on
   ``<workspace>/calendar.json``; the first that needs the inbox reads ``<workspace>/inbox.json``.
   The tool results are those fixture objects as indented JSON (the files' contents). Later
   turns answer from the context.
4. **Assistant replies** (the "recorded responses" the next turn's history carries): the read
   call above (text "Let me check your calendar." etc.), then a final answer written by
   :func:`compose_answer`: the prompt's ground-truth output when the fixture has one, and up to
   three calendar events / emails that best match the prompt (shared words, dates named in the
   prompt), one line each.

User and assistant contents are OpenAI text-part lists, as in the captures. Every call's
``response`` is what the next call's history holds, so max_tokens comes from its token estimate.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from evals.replay.convert import block_text, tools_to_openai
from evals.replay.traces import Call

W4_TURNS = 13
THREAD = "w4_openclaw_assembled"
CAPTURE = "W4_openclaw_assistant/openclaw_openai.jsonl"
_DRIVE = re.compile(r"\b(files?|drive)\b|\.docx|\.xlsx", re.I)
_EMAIL = re.compile(r"\bemails?\b(?!\s+address)", re.I)
_CALENDAR = re.compile(r"\b(calendar|events?|appointments?|meetings?)\b", re.I)
_RUNTIME_REPO = re.compile(r"Runtime:[^\n]*?\brepo=([^\s|]+)")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_MONTH_DAY = re.compile(r"\b(" + "|".join(_MONTHS) + r")\s+(\d{1,2})(?:st|nd|rd|th)?\b", re.I)
_ISO_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if not found:
        raise FileNotFoundError(f"W4: no {pattern} in {folder}")
    return found[0]


def load_openclaw_context(root: Path) -> tuple[str, list[dict]]:
    """``(system prompt, OpenAI tools)`` of the last OpenClaw capture line.

    Raises:
        FileNotFoundError: no capture. ValueError: its last line has no system message or tools.
    """
    path = root / CAPTURE
    if not path.is_file():
        raise FileNotFoundError(f"W4: no OpenClaw capture at {path}")
    lines = [json.loads(t) for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
    last = lines[-1]
    first = last["messages"][0] if last.get("messages") else {}
    if first.get("role") != "system" or not last.get("tools"):
        raise ValueError(f"{path}: the last line needs a system message and tools")
    return block_text(first.get("content")), tools_to_openai(last["tools"])


def select_prompts(prompts: list[dict], n: int = W4_TURNS) -> list[dict]:
    """The ``n`` user prompts of step 2 of the module docstring.

    Raises:
        ValueError: fewer than ``n`` eligible prompts.
    """
    eligible = [p for p in prompts if not _DRIVE.search(p["prompt"])]
    calendar = [p for p in eligible if not _EMAIL.search(p["prompt"])]
    email = [p for p in eligible if _EMAIL.search(p["prompt"])]
    out: list[dict] = []
    while len(out) < n and (calendar or email):
        for source in (calendar, email):
            if source and len(out) < n:
                out.append(source.pop(0))
    if len(out) < n:
        raise ValueError(f"W4 needs {n} mailbox/calendar prompts, the fixture has {len(out)}")
    return out


def needs(prompt: str) -> tuple[str, ...]:
    """Fixture files a prompt needs, among ``("calendar", "inbox")``."""
    if not _EMAIL.search(prompt):
        return ("calendar",)
    return ("calendar", "inbox") if _CALENDAR.search(prompt) else ("inbox",)


def _dates(prompt: str, year: str) -> set[str]:
    found = set(_ISO_DATE.findall(prompt))
    for month, day in _MONTH_DAY.findall(prompt):
        found.add(f"{year}-{_MONTHS.index(month.lower()) + 1:02d}-{int(day):02d}")
    return found


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 3}


def compose_answer(prompt: dict, fixture: dict, sources: tuple[str, ...]) -> str:
    """The final assistant answer of one user turn (step 4 of the module docstring)."""
    year = str(fixture["calendar"].get("current_day", "2024"))[:4]
    dates, words = _dates(prompt["prompt"], year), _words(prompt["prompt"])
    scored: list[tuple[int, int, str]] = []
    if "calendar" in sources:
        for n, ev in enumerate(fixture["calendar"]["initial_events"]):
            score = len(words & _words(f"{ev['title']} {ev.get('description', '')}")) \
                + 2 * (str(ev["start_time"])[:10] in dates)
            line = f"- {ev['title']}: {ev['start_time']} to {ev['end_time']}, {ev.get('location')}"
            scored.append((score, n, line))
    if "inbox" in sources:
        for n, mail in enumerate(fixture["inbox"]["initial_emails"]):
            score = len(words & _words(f"{mail['subject']} {mail.get('body', '')}"))
            line = f"- \"{mail['subject']}\" from {mail['sender']}, {mail['timestamp']}"
            scored.append((score, 1000 + n, line))
    best = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))[:3]
    truth = prompt.get("ground_truth_output")
    head = f"The answer is {truth}." if truth else "Here is what I found."
    return "\n".join([head] + [line for _, _, line in best])


def _text(value: str) -> list[dict]:
    return [{"type": "text", "text": value}]


def assemble_w4(root: Path, turns: int = W4_TURNS) -> list[Call]:
    """The assembled session's calls (OpenAI wire format, harness ``openclaw``), each waiting
    for the previous one.

    Raises:
        FileNotFoundError: a missing capture or fixture. ValueError: too few prompts.
    """
    system, tools = load_openclaw_context(root)
    fixtures = root / "W4_fixtures"
    fixture = json.loads(_one(fixtures, "*mailbox_calendar.json").read_text(encoding="utf-8"))
    prompts = json.loads(_one(fixtures, "*user_prompts.json").read_text(encoding="utf-8"))
    match = _RUNTIME_REPO.search(system)
    workspace = match.group(1) if match else "/workspace"
    history: list[dict] = [{"role": "system", "content": system}]
    read: set[str] = set()
    calls: list[Call] = []

    def add(response: dict) -> None:
        n = len(calls)
        deps = (calls[-1].key,) if calls else ()
        calls.append(Call(f"{THREAD}#{n}", "W4_assembled", THREAD, n, "openai", "openclaw",
                          list(history), tools, response, deps))
        history.append(response)

    for i, prompt in enumerate(select_prompts(prompts["prompts"], turns)):
        history.append({"role": "user", "content": _text(prompt["prompt"])})
        sources = needs(prompt["prompt"])
        missing = [s for s in sources if s not in read]
        if missing:
            ids = [f"call_w4_{i}_{s}" for s in missing]
            note = f"Let me check your {' and '.join(missing)}."
            add({"role": "assistant", "content": _text(note),
                 "tool_calls": [{"id": cid, "type": "function", "function": {
                     "name": "read", "arguments": json.dumps({"path": f"{workspace}/{s}.json"})}}
                     for cid, s in zip(ids, missing)]})
            for cid, s in zip(ids, missing):
                body = json.dumps(fixture[s], indent=2, ensure_ascii=False)
                history.append({"role": "tool", "tool_call_id": cid, "content": body})
            read.update(missing)
        add({"role": "assistant", "content": _text(compose_answer(prompt, fixture, sources))})
    return calls
