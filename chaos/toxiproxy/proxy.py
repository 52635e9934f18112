"""A proxy: one listener, its links, and its toxics (one chain per stream).

``Proxy.start`` binds the listen address (``host:port``; port 0 picks a free port, and the
bound address replaces it, so that a proxy disabled and enabled again listens where it did)
and accepts in a task of the nursery it was given. ``Proxy.stop`` closes the listener and
every link, and returns once they are closed: a client connecting after it is refused.
"""

from __future__ import annotations

import random

import trio

from .errors import TOXIC_EXISTS, TOXIC_NOT_FOUND, ApiError, bad_request
from .link import Link
from .toxics import STREAMS, ToxicSpec

UPSTREAM_CONNECT_TIMEOUT_S = 10.0
LISTEN_BACKLOG = 128
ACCEPT_ERROR_PAUSE_S = 0.1  # EMFILE and the like: pause instead of spinning


def split_host_port(address: str, what: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a pair; ApiError 400 if it is not one."""
    if not isinstance(address, str) or ":" not in address:
        raise bad_request(f"{what} must be host:port, not {address!r}")
    host, _, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise bad_request(f"{what} has no valid port: {address!r}")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def bind_listener(address: str) -> tuple[trio.SocketListener, str]:
    """A listening socket on ``address`` and the address it is bound to (ApiError 500 if taken)."""
    host, port = split_host_port(address, "listen")
    host = host or "0.0.0.0"
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        family, _, _, _, sockaddr = infos[0]
        sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        try:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
            await sock.bind(sockaddr)
            sock.listen(LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
    except OSError as error:
        raise ApiError(500, f"listen tcp {address}: {error.strerror or error}") from None
    bound_host, bound_port = sock.getsockname()[:2]
    return trio.SocketListener(sock), join_host_port(bound_host, bound_port)


class ToxicCollection:
    """A proxy's toxics: one ordered chain per stream, a version and a change event each."""

    def __init__(self) -> None:
        self._chains: dict[str, tuple[ToxicSpec, ...]] = {stream: () for stream in STREAMS}
        self._versions = {stream: 0 for stream in STREAMS}
        self._events = {stream: trio.Event() for stream in STREAMS}

    def chain(self, stream: str) -> tuple[ToxicSpec, ...]:
        return self._chains[stream]

    def version(self, stream: str) -> int:
        return self._versions[stream]

    def changed(self, stream: str) -> trio.Event:
        """An event set at the next change of ``stream``'s chain."""
        return self._events[stream]

    def all(self) -> list[ToxicSpec]:
        """Every toxic, upstream chain first, each in the order added (Toxiproxy's listing order)."""
        return [spec for stream in STREAMS for spec in self._chains[stream]]

    def get(self, name: str) -> ToxicSpec:
        for spec in self.all():
            if spec.name == name:
                return spec
        raise ApiError(404, TOXIC_NOT_FOUND)

    def add(self, spec: ToxicSpec) -> None:
        if any(existing.name == spec.name for existing in self.all()):
            raise ApiError(409, TOXIC_EXISTS)
        self._set(spec.stream, self._chains[spec.stream] + (spec,))

    def replace(self, spec: ToxicSpec) -> None:
        current = self.get(spec.name)
        self._set(spec.stream, tuple(spec if existing is current else existing for existing in self._chains[spec.stream]))

    def remove(self, name: str) -> None:
        current = self.get(name)
        self._set(current.stream, tuple(spec for spec in self._chains[current.stream] if spec is not current))

    def clear(self) -> None:
        for stream in STREAMS:
            if self._chains[stream]:
                self._set(stream, ())

    def _set(self, stream: str, chain: tuple[ToxicSpec, ...]) -> None:
        self._chains[stream] = chain
        self._versions[stream] += 1
        event, self._events[stream] = self._events[stream], trio.Event()
        event.set()


class Proxy:
    """A named proxy from ``listen`` to ``upstream``; its tasks live in ``nursery``."""

    def __init__(self, name: str, listen: str, upstream: str, *, nursery: trio.Nursery, rng: random.Random) -> None:
        split_host_port(listen, "listen")
        split_host_port(upstream, "upstream")
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics = ToxicCollection()
        self.links: set[Link] = set()
        self._nursery = nursery
        self._rng = rng
        self._scope: trio.CancelScope | None = None
        self._stopped: trio.Event | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream, "enabled": self.enabled,
                "toxics": [spec.to_json() for spec in self.toxics.all()]}

    async def start(self) -> None:
        """Listen (no-op if enabled). ApiError 500 if the address cannot be bound."""
        if self.enabled:
            return
        listener, self.listen = await bind_listener(self.listen)
        self._scope, self._stopped = trio.CancelScope(), trio.Event()
        self._nursery.start_soon(self._serve, listener, self._scope, self._stopped)
        self.enabled = True

    async def stop(self) -> None:
        """Close the listener and every link; return once they are closed (no-op if disabled)."""
        if not self.enabled:
            return
        self.enabled = False
        self._scope.cancel()
        await self._stopped.wait()

    async def _serve(self, listener: trio.SocketListener, scope: trio.CancelScope, stopped: trio.Event) -> None:
        try:
            with scope:
                async with listener, trio.open_nursery() as links:
                    while True:
                        try:
                            client = await listener.accept()
                        except OSError:
                            await trio.sleep(ACCEPT_ERROR_PAUSE_S)
                            continue
                        links.start_soon(self._forward, client)
        finally:
            stopped.set()

    async def _forward(self, client: trio.SocketStream) -> None:
        host, port = split_host_port(self.upstream, "upstream")
        upstream = None
        try:
            with trio.fail_after(UPSTREAM_CONNECT_TIMEOUT_S):
                upstream = await trio.open_tcp_stream(host, port)
        except (OSError, trio.TooSlowError):
            pass  # as Toxiproxy: the client sees its connection closed
        finally:
            if upstream is None:
                await trio.aclose_forcefully(client)
        if upstream is None:
            return
        link = Link(client, upstream, self.toxics, self._rng)
        self.links.add(link)
        try:
            await link.run()
        finally:
            self.links.discard(link)
