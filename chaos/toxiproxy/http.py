"""Just enough HTTP/1.1 for the Toxiproxy API: a request parser that does no I/O (feed it
bytes, take whole requests out) and a response renderer.

Bounded: a request head is at most 16 KiB, a body at most 1 MiB and needs Content-Length
(the API's clients send JSON bodies with a length; chunked bodies are refused with 411).
Persistent connections follow HTTP/1.1 (keep-alive unless ``Connection: close``; HTTP/1.0
closes unless ``Connection: keep-alive``).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

HEAD_BYTES_MAX = 16 * 1024
BODY_BYTES_MAX = 1024 * 1024
HEADERS_MAX = 100


class HttpError(Exception):
    """A request that cannot be parsed; answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Request:
    """One parsed request. Header names are lower-case."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


class RequestParser:
    """Collects bytes of one connection and cuts them into requests."""

    def __init__(self, head_bytes_max: int = HEAD_BYTES_MAX, body_bytes_max: int = BODY_BYTES_MAX) -> None:
        self._buffer = bytearray()
        self._head_bytes_max = head_bytes_max
        self._body_bytes_max = body_bytes_max

    @property
    def idle(self) -> bool:
        """True between requests (no partial request buffered)."""
        return not self._buffer

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_request(self) -> Request | None:
        """The next whole request, or None until more bytes come. Raises ``HttpError``."""
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > self._head_bytes_max:
                raise HttpError(431, "request head too large")
            return None
        if end > self._head_bytes_max:
            raise HttpError(431, "request head too large")
        method, target, version, headers = self._parse_head(bytes(self._buffer[:end]))
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise HttpError(411, "send the body with a Content-Length")
        length_text = headers.get("content-length", "0").strip()
        if not length_text.isdigit():
            raise HttpError(400, "bad Content-Length")
        length = int(length_text)
        if length > self._body_bytes_max:
            raise HttpError(413, f"body larger than {self._body_bytes_max} bytes")
        start = end + 4
        if len(self._buffer) < start + length:
            return None
        body = bytes(self._buffer[start:start + length])
        del self._buffer[:start + length]
        return Request(method, target, version, headers, body)

    @staticmethod
    def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
            raise HttpError(400, "bad request head") from None
        lines = text.split("\r\n")
        request_line = lines[0].split(" ")
        if len(request_line) != 3 or not request_line[2].startswith("HTTP/1."):
            raise HttpError(400, "bad request line")
        method, target, version = request_line
        if len(lines) - 1 > HEADERS_MAX:
            raise HttpError(431, "too many headers")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise HttpError(400, "bad header line")
            headers[name.lower()] = value.strip()
        return method, target, version, headers


def render_response(status: int, body: bytes, content_type: str, keep_alive: bool) -> bytes:
    """The bytes of a response."""
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Unknown"
    head = [f"HTTP/1.1 {status} {reason}"]
    if status != 204:
        head.append(f"Content-Type: {content_type}")
        head.append(f"Content-Length: {len(body)}")
    if not keep_alive:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body if status != 204 else b"")
