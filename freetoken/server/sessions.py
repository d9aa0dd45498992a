"""Harness sessions: which adapter and anchor policy serve a request, and what each session reused.

A request is bound to a session (shared/research/harnesses.md §9; issue 5 "Session API"):

1. ``X-FreeToken-Session: <id>`` names a session made with ``POST /v1/sessions``: its adapter
   and anchor policy are used (404 when the id is unknown or expired);
2. otherwise ``X-FreeToken-Harness: <name>`` forces an adapter, or detection
   (:func:`harness_adapters.detect_adapter`) picks one from the headers, path and body; the
   request joins the implicit session ``<harness>:<client session id>`` (the client's own id,
   e.g. Claude Code's ``X-Claude-Code-Session-Id``, or ``default``), made on first use.

Sessions idle longer than ``idle_timeout_s`` expire; past ``max_sessions`` the least recently
used one is dropped. All methods are thread-safe (routes run on the event loop, rendering in a
worker thread).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harness_adapters import (
    HARNESS_HEADER,
    HarnessAdapter,
    RequestInfo,
    adapter_names,
    detect_adapter,
    get_adapter,
)
from freetoken.prefix.anchors import AnchorKind, AnchorPolicy
from starlette.requests import Request

from freetoken.server.errors import Api, APIError, bad_request

SESSION_HEADER = "x-freetoken-session"
"""Request header naming an explicit session (``POST /v1/sessions``)."""

DEFAULT_CLIENT_KEY = "default"
MAX_MODEL_NAME = 256
"""Longest model name a session keeps (characters)."""


@dataclass
class Session:
    """One harness session and its running totals.

    Attributes:
        id: ``sess_<hex>`` (explicit) or ``<harness>:<client key>`` (implicit).
        adapter: the harness adapter serving it.
        anchors: checkpoint anchor kinds of its requests; None uses the server's ``--anchors``.
        anchors_source: ``session`` (set at creation), ``harness`` (the adapter's policy) or
            ``server`` (the generic adapter: ``--anchors``).
        explicit: made by ``POST /v1/sessions`` (else by detection).
        model: the model name given at creation (explicit sessions), else the last requested.
        harness_version: the harness version seen last (``2.1.197``), if detected.
        created / last_used: unix times (s).
        requests, prompt_tokens, reused_tokens, recomputed_tokens, generated_tokens: totals over
            finished requests (tokens); reused = served from the prefix cache, recomputed =
            prompt − reused (prefilled).
        last_prompt: token ids of the latest finished request's prompt (for the checkpoint count).
    """

    id: str
    adapter: HarnessAdapter
    anchors: AnchorPolicy | None
    anchors_source: str
    explicit: bool
    model: str | None = None
    harness_version: tuple[int, ...] | None = None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    requests: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    recomputed_tokens: int = 0
    generated_tokens: int = 0
    last_prompt: tuple[int, ...] = ()

    def to_json(self, idle_timeout_s: float, path_stats: Mapping[str, int] | None) -> dict:
        """The ``session`` object of the API (times in unix seconds, counts in tokens).

        Args:
            idle_timeout_s: the store's idle timeout (for ``expires_at``).
            path_stats: the engine's view of ``last_prompt`` (``cached_tokens``, ``checkpoints``:
                see ``PrefixCache.path_stats``), or None without a prefix cache.
        """
        anchors = sorted(k.value for k in self.anchors.kinds) if self.anchors is not None else None
        return {
            "id": self.id,
            "object": "session",
            "harness": self.adapter.name,
            "harness_title": self.adapter.title,
            "harness_version": ".".join(map(str, self.harness_version)) if self.harness_version else None,
            "explicit": self.explicit,
            "model": self.model,
            "anchors": anchors,
            "anchors_source": self.anchors_source,
            "created_at": int(self.created),
            "last_used_at": int(self.last_used),
            "expires_at": int(self.last_used + idle_timeout_s),
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "recomputed_tokens": self.recomputed_tokens,
            "generated_tokens": self.generated_tokens,
            "checkpoints_held": None if path_stats is None else int(path_stats["checkpoints"]),
            "cached_prefix_tokens": None if path_stats is None else int(path_stats["cached_tokens"]),
        }


@dataclass
class HarnessTotals:
    """Finished requests of one harness since the server started, and their prompt tokens
    reused from / recomputed past the prefix cache (for ``/metrics``)."""

    requests: int = 0
    reused_tokens: int = 0
    recomputed_tokens: int = 0


@dataclass(frozen=True)
class HarnessBinding:
    """What serves one request: its adapter, its session and the anchor policy to use.

    Attributes:
        adapter: normalises the messages before templating.
        session: where the request's totals go.
        anchors: handed to the engine as ``GenerationRequest.anchors`` (None: server default).
    """

    adapter: HarnessAdapter
    session: Session
    anchors: AnchorPolicy | None


def request_info(request: Request, api: Api, body: Mapping[str, Any]) -> RequestInfo:
    """What harness detection sees of an HTTP request (header names lower-cased)."""
    return RequestInfo(api=api, path=request.url.path,
                       headers={k.lower(): v for k, v in request.headers.items()}, body=body)


def parse_anchors(value: Any, param: str = "anchors") -> AnchorPolicy:
    """An anchor policy from the API: a comma-separated string (``"turn_start,generation_start"``,
    or ``all`` / ``default`` / ``none``) or a list of kind names.

    Raises:
        APIError: 400 naming ``param`` for anything else or an unknown kind.
    """
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = ",".join(value) if value else "none"
    if not isinstance(value, str):
        raise bad_request(f"{param}: expected a string or a list of anchor kind names", param=param)
    try:
        return AnchorPolicy.parse(value)
    except ValueError as exc:
        kinds = ", ".join(k.value for k in AnchorKind)
        raise bad_request(f"{param}: {exc} (kinds: {kinds}; or all, default, none)", param=param) from None


def lookup_adapter(name: Any, param: str) -> HarnessAdapter:
    """The adapter called ``name`` (canonical name or alias).

    Raises:
        APIError: 400 naming ``param`` when there is none.
    """
    if not isinstance(name, str) or not name:
        raise bad_request(f"{param}: expected one of: {', '.join(adapter_names())}", param=param)
    try:
        return get_adapter(name)
    except ValueError as exc:
        raise bad_request(f"{param}: {exc}", param=param) from None


class SessionStore:
    """All live sessions, keyed by id, least recently used first.

    Args:
        idle_timeout_s: seconds of inactivity after which a session expires (> 0).
        max_sessions: most sessions kept (≥ 1); the least recently used is dropped beyond it.
        clock: wall clock in unix seconds (tests inject one).

    Raises:
        ValueError: a non-positive limit.
    """

    def __init__(self, idle_timeout_s: float = 3600.0, max_sessions: int = 1024,
                 clock: Callable[[], float] = time.time) -> None:
        if idle_timeout_s <= 0:
            raise ValueError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.idle_timeout_s = idle_timeout_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._totals: dict[str, HarnessTotals] = {}

    # --- lifecycle -------------------------------------------------------------------------
    def create(self, adapter: HarnessAdapter, model: str | None = None,
               anchors: AnchorPolicy | None = None) -> Session:
        """A new explicit session (``POST /v1/sessions``); ``anchors`` None takes the adapter's
        policy (the server default for the generic adapter)."""
        source, policy = self._policy(adapter, None, anchors)
        now = self._clock()
        session = Session(f"sess_{secrets.token_hex(12)}", adapter, policy, source, True,
                          model=model, created=now, last_used=now)
        with self._lock:
            self._expire(now)
            self._add(session)
        return session

    def get(self, session_id: str) -> Session:
        """The live session ``session_id``.

        Raises:
            APIError: 404 when it does not exist or has expired.
        """
        with self._lock:
            self._expire(self._clock())
            session = self._sessions.get(session_id)
        if session is None:
            raise APIError(404, f"session {session_id!r} not found (unknown or expired)",
                           param=SESSION_HEADER, code="session_not_found")
        return session

    def delete(self, session_id: str) -> None:
        """Forget a session (its cached prefixes stay in the engine's cache).

        Raises:
            APIError: 404 when it does not exist.
        """
        with self._lock:
            if self._sessions.pop(session_id, None) is None:
                raise APIError(404, f"session {session_id!r} not found (unknown or expired)",
                               code="session_not_found")

    def list(self) -> list[Session]:
        """Live sessions, most recently used first."""
        with self._lock:
            self._expire(self._clock())
            return list(reversed(self._sessions.values()))

    # --- per request -----------------------------------------------------------------------
    def bind(self, info: RequestInfo) -> HarnessBinding:
        """The adapter, session and anchors serving a request (see the module docstring).

        Raises:
            APIError: 404 for an unknown/expired ``X-FreeToken-Session``; 400 for an unknown
                ``X-FreeToken-Harness``.
        """
        session_id = info.header(SESSION_HEADER)
        if session_id:
            session = self.get(session_id)
            with self._lock:
                self._touch(session, info)
            return HarnessBinding(session.adapter, session, session.anchors)
        forced = info.header(HARNESS_HEADER)
        adapter = lookup_adapter(forced, HARNESS_HEADER) if forced else detect_adapter(info)
        version = adapter.version(info)
        key = f"{adapter.name}:{adapter.session_key(info) or DEFAULT_CLIENT_KEY}"
        now = self._clock()
        with self._lock:
            self._expire(now)
            session = self._sessions.get(key)
            if session is None:
                source, policy = self._policy(adapter, version, None)
                session = Session(key, adapter, policy, source, False, created=now, last_used=now)
                self._add(session)
            self._touch(session, info, version)
        return HarnessBinding(adapter, session, session.anchors)

    def adapter_for(self, info: RequestInfo) -> HarnessAdapter:
        """The adapter :meth:`bind` would use, without making or touching a session (for
        ``count_tokens``, which is not a model call).

        Raises:
            APIError: as :meth:`bind`.
        """
        session_id = info.header(SESSION_HEADER)
        if session_id:
            return self.get(session_id).adapter
        forced = info.header(HARNESS_HEADER)
        return lookup_adapter(forced, HARNESS_HEADER) if forced else detect_adapter(info)

    def record(self, session: Session, prompt_ids: tuple[int, ...], prompt_tokens: int,
               cached_tokens: int, completion_tokens: int) -> None:
        """Add one finished request to ``session``'s totals (tokens)."""
        with self._lock:
            session.requests += 1
            session.prompt_tokens += prompt_tokens
            session.reused_tokens += cached_tokens
            session.recomputed_tokens += prompt_tokens - cached_tokens
            session.generated_tokens += completion_tokens
            totals = self._totals.setdefault(session.adapter.name, HarnessTotals())
            totals.requests += 1
            totals.reused_tokens += cached_tokens
            totals.recomputed_tokens += prompt_tokens - cached_tokens
            session.last_prompt = prompt_ids
            session.last_used = self._clock()
            if session.id in self._sessions:
                self._sessions.move_to_end(session.id)

    def metrics(self) -> tuple[dict[str, HarnessTotals], dict[str, int]]:
        """Per harness: totals since start (never decrease) and live sessions now."""
        with self._lock:
            self._expire(self._clock())
            live: dict[str, int] = {}
            for session in self._sessions.values():
                live[session.adapter.name] = live.get(session.adapter.name, 0) + 1
            totals = {k: HarnessTotals(v.requests, v.reused_tokens, v.recomputed_tokens)
                      for k, v in self._totals.items()}
        return totals, live

    # --- internals (called with the lock held) ----------------------------------------------
    @staticmethod
    def _policy(adapter: HarnessAdapter, version: tuple[int, ...] | None,
                anchors: AnchorPolicy | None) -> tuple[str, AnchorPolicy | None]:
        if anchors is not None:
            return "session", anchors
        if adapter.name == "generic":
            return "server", None
        return "harness", adapter.anchor_policy(version)

    def _touch(self, session: Session, info: RequestInfo,
               version: tuple[int, ...] | None = None) -> None:
        session.last_used = self._clock()
        if version is not None:
            session.harness_version = version
        model = info.body.get("model") if isinstance(info.body, Mapping) else None
        if isinstance(model, str) and (not session.explicit or session.model is None):
            session.model = model[:MAX_MODEL_NAME]
        self._sessions.move_to_end(session.id)

    def _add(self, session: Session) -> None:
        """Insert ``session``; beyond the cap the least recently used detected session goes
        first (explicit ones only when no detected one is left), so a flood of new client ids
        cannot push out sessions made with ``POST /v1/sessions``."""
        self._sessions[session.id] = session
        while len(self._sessions) > self.max_sessions:
            victim = next((k for k, s in self._sessions.items() if not s.explicit), None)
            if victim is None:
                self._sessions.popitem(last=False)
            else:
                del self._sessions[victim]

    def _expire(self, now: float) -> None:
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.last_used <= self.idle_timeout_s:
                return
            self._sessions.popitem(last=False)
