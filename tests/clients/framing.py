"""Incremental HTTP/1.x message framing for one direction of one connection (RFC 9112 section 6:
Content-Length, chunked transfer coding with extensions and trailers, read-until-close; responses
to HEAD and 1xx/204/304 responses carry no body)."""

from __future__ import annotations

from collections import deque


class HttpFramer:
    """Incremental HTTP/1.x message parser for one direction of one connection.

    ``feed`` returns a list of events: ``("head", start_line, headers)``, ``("body", bytes)`` and
    ``("end",)``; ``bodyless`` tells it, per response, that no body follows (HEAD, 1xx, 204, 304).
    """

    def __init__(self, is_response: bool, bodyless: "deque[bool]") -> None:
        self.is_response = is_response
        self.bodyless = bodyless
        self.buf = bytearray()
        self.state = "head"
        self.remaining = 0

    def feed(self, data: bytes) -> list[tuple]:
        """Consume ``data`` and return the events it completes.

        Raises:
            ValueError: a malformed status line, Content-Length or chunk size.
        """
        self.buf += data
        events: list[tuple] = []
        while True:
            step = getattr(self, f"_{self.state}")(events)
            if not step:
                return events

    def eof(self) -> list[tuple]:
        """The connection closed: ends a read-until-close response body."""
        if self.state == "until_close":
            self.state = "head"
            return [("body", bytes(self.buf)), ("end",)]
        return []

    def _head(self, events: list[tuple]) -> bool:
        cut = self.buf.find(b"\r\n\r\n")
        if cut < 0:
            return False
        lines = bytes(self.buf[:cut]).decode("latin-1").split("\r\n")
        del self.buf[: cut + 4]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        events.append(("head", lines[0], headers))
        self._pick_framing(lines[0], headers, events)
        return True

    def _pick_framing(self, start: str, headers: dict[str, str], events: list[tuple]) -> None:
        if self.is_response:
            status = int(start.split()[1])
            if 100 <= status < 200:
                self.state = "head"  # interim response: the final one follows for the same request
                return
            no_body = self.bodyless.popleft() if self.bodyless else False
            if no_body or status in (204, 304):
                events.append(("end",))
                self.state = "head"
                return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = "chunk_size"
        elif "content-length" in headers:
            self.remaining = int(headers["content-length"])
            self.state = "length" if self.remaining else "head"
            if not self.remaining:
                events.append(("end",))
        elif self.is_response:
            self.state = "until_close"
        else:
            events.append(("end",))
            self.state = "head"

    def _length(self, events: list[tuple]) -> bool:
        if not self.buf:
            return False
        take = bytes(self.buf[: self.remaining])
        del self.buf[: len(take)]
        self.remaining -= len(take)
        events.append(("body", take))
        if self.remaining == 0:
            events.append(("end",))
            self.state = "head"
        return True

    def _chunk_size(self, events: list[tuple]) -> bool:
        cut = self.buf.find(b"\r\n")
        if cut < 0:
            return False
        size = int(bytes(self.buf[:cut]).split(b";")[0].strip(), 16)
        del self.buf[: cut + 2]
        if size == 0:
            self.state = "trailers"
        else:
            self.remaining = size
            self.state = "chunk_data"
        return True

    def _chunk_data(self, events: list[tuple]) -> bool:
        if len(self.buf) < self.remaining + 2:
            return False
        events.append(("body", bytes(self.buf[: self.remaining])))
        del self.buf[: self.remaining + 2]
        self.state = "chunk_size"
        return True

    def _trailers(self, events: list[tuple]) -> bool:
        if self.buf.startswith(b"\r\n"):
            del self.buf[:2]
        else:
            cut = self.buf.find(b"\r\n\r\n")
            if cut < 0:
                return False
            del self.buf[: cut + 4]
        events.append(("end",))
        self.state = "head"
        return True

    def _until_close(self, events: list[tuple]) -> bool:
        return False
