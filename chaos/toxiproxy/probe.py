"""Things to measure a proxy with: an upstream server and a small HTTP client, both trio.

``serve_upstream`` speaks a one-line protocol: a connection's first line picks its mode.

    ECHO\\n          every byte after the line comes back
    SEND n\\n        n bytes (a repeating pattern, see ``pattern``) come back, then the
                    server waits for the client to close
    SEND n close\\n  the same, then the server closes

``api_request`` sends one HTTP/1.1 request (``Connection: close``) and returns the status,
headers and body: the conformance tests use it to see exactly what a Toxiproxy answers.
``python -m chaos.toxiproxy.probe [--port N]`` runs the upstream server alone (the bench's
upstream process) and prints ``upstream listening on 127.0.0.1:PORT``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlsplit

import trio

LINE_BYTES_MAX = 256
SEND_BYTES_MAX = 1 << 30
CHUNK_BYTES = 64 * 1024
_PATTERN = bytes(range(256)) * (CHUNK_BYTES // 256)


def pattern(count: int, offset: int = 0) -> bytes:
    """The bytes a SEND answers with, from ``offset`` on."""
    start = offset % 256
    whole = _PATTERN[start:] + _PATTERN * (1 + count // len(_PATTERN))
    return whole[:count]


async def _read_line(stream: trio.SocketStream) -> tuple[bytes, bytes]:
    buffer = b""
    while b"\n" not in buffer:
        data = await stream.receive_some(LINE_BYTES_MAX)
        if not data or len(buffer) + len(data) > LINE_BYTES_MAX:
            raise ValueError("no command line")
        buffer += data
    line, _, rest = buffer.partition(b"\n")
    return line.strip(), rest


async def _handle(stream: trio.SocketStream) -> None:
    try:
        async with stream:
            line, rest = await _read_line(stream)
            words = line.split()
            if words == [b"ECHO"]:
                if rest:
                    await stream.send_all(rest)
                while data := await stream.receive_some(CHUNK_BYTES):
                    await stream.send_all(data)
            elif len(words) in (2, 3) and words[0] == b"SEND" and words[1].isdigit():
                await _send(stream, min(int(words[1]), SEND_BYTES_MAX))
                if words[2:] != [b"close"]:
                    while await stream.receive_some(CHUNK_BYTES):
                        pass
    except (ValueError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


async def _send(stream: trio.SocketStream, count: int) -> None:
    sent = 0
    while sent < count:
        piece = min(CHUNK_BYTES, count - sent)
        await stream.send_all(pattern(piece, sent))
        sent += piece


async def serve_upstream(host: str = "127.0.0.1", port: int = 0, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ECHO / SEND connections until cancelled; ``task_status.started`` gets ``host:port``."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, _handle, listeners)
        task_status.started(f"{bound[0]}:{bound[1]}")


@dataclass(frozen=True)
class HttpAnswer:
    """A response: status, lower-case headers, body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


async def api_request(url: str, method: str, path: str, body=None, *, raw: bytes | None = None,
                      headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> HttpAnswer:
    """One request to ``url`` (``http://host:port``); ``body`` is sent as JSON, ``raw`` as is."""
    parts = urlsplit(url)
    payload = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    head = [f"{method} {path} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close",
            f"Content-Length: {len(payload)}"]
    if body is not None:
        head.append("Content-Type: application/json")
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    with trio.fail_after(timeout_s):
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        async with stream:
            await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
            answer = b""
            while data := await stream.receive_some(CHUNK_BYTES):
                answer += data
    head_bytes, _, rest = answer.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    if "content-length" in fields:
        rest = rest[:int(fields["content-length"])]
    return HttpAnswer(status, fields, rest)


def main(argv: list[str] | None = None) -> None:
    """Run the upstream server until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m chaos.toxiproxy.probe")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    arguments = parser.parse_args(argv)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(partial(serve_upstream, arguments.host, arguments.port))
            print(f"upstream listening on {address}", flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()


class ApiSession:
    """A Toxiproxy API seen from a trio test or bench: requests, and the proxies it created,
    deleted by ``cleanup`` (so a run against a real, shared Toxiproxy leaves nothing behind)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.created: list[str] = []

    async def request(self, method: str, path: str, body=None, **kwargs) -> HttpAnswer:
        return await api_request(self.url, method, path, body, **kwargs)

    async def create_proxy(self, name: str, upstream: str, **fields) -> tuple[str, int]:
        """Create a proxy listening on a free port of 127.0.0.1; its (host, port)."""
        answer = await self.request("POST", "/proxies", {"name": name, "upstream": upstream,
                                                         "listen": "127.0.0.1:0", **fields})
        if answer.status != 201:
            raise AssertionError(f"creating proxy {name}: {answer.status} {answer.body!r}")
        self.created.append(name)
        host, _, port = answer.json()["listen"].rpartition(":")
        return host, int(port)

    async def add_toxic(self, proxy: str, toxic_type: str, attributes: dict, **fields) -> dict:
        answer = await self.request("POST", f"/proxies/{proxy}/toxics",
                                    {"type": toxic_type, "attributes": attributes, **fields})
        if answer.status != 200:
            raise AssertionError(f"adding a {toxic_type} toxic: {answer.status} {answer.body!r}")
        return answer.json()

    async def cleanup(self) -> None:
        for name in self.created:
            await self.request("DELETE", f"/proxies/{name}")
