"""The Toxiproxy-compatible server: the REST API on one listener (127.0.0.1:8474 by default),
proxies in the same trio loop.

    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_toxiproxy, "127.0.0.1", 0)
        ...  # address.url is "http://127.0.0.1:<port>"

API connections are bounded (``API_CONNECTIONS_MAX``; more are closed at once), as are the
time to receive a request (``REQUEST_TIMEOUT_S``) and an idle keep-alive connection's life
(``IDLE_TIMEOUT_S``). Cancelling the task stops the API and every proxy and link.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import trio

from .api import ToxiproxyApi
from .errors import ToxiproxyStartError
from .http import HttpError, RequestParser, render_response
from .proxy import join_host_port

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8474
API_CONNECTIONS_MAX = 256
REQUEST_TIMEOUT_S = 15.0
IDLE_TIMEOUT_S = 60.0
RECEIVE_BYTES = 64 * 1024


@dataclass(frozen=True)
class ServerAddress:
    """Where a started server's API listens."""

    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{join_host_port(self.host, self.port)}"


@dataclass(frozen=True)
class ServerStatistics:
    """A snapshot of a running server."""

    proxies: int
    proxies_enabled: int
    links_open: int
    toxics: int
    api_connections: int


class ToxiproxyServer:
    """The API's connections over one ``ToxiproxyApi``."""

    def __init__(self, api: ToxiproxyApi) -> None:
        self.api = api
        self._connections = 0

    def statistics(self) -> ServerStatistics:
        proxies = list(self.api.proxies.values())
        return ServerStatistics(len(proxies), sum(proxy.enabled for proxy in proxies),
                                sum(len(proxy.links) for proxy in proxies),
                                sum(len(proxy.toxics.all()) for proxy in proxies), self._connections)

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        """Answer requests on one connection until it closes, idles out or breaks the protocol."""
        if self._connections >= API_CONNECTIONS_MAX:
            await trio.aclose_forcefully(stream)
            return
        self._connections += 1
        try:
            async with stream:
                await self._requests(stream, RequestParser())
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self._connections -= 1

    async def _requests(self, stream: trio.SocketStream, parser: RequestParser) -> None:
        while True:
            try:
                request = parser.next_request()
            except HttpError as error:
                body = f'{{"error": "{error.message}", "status": {error.status}}}'.encode()
                await stream.send_all(render_response(error.status, body, "application/json", False))
                return
            if request is None:
                with trio.move_on_after(IDLE_TIMEOUT_S if parser.idle else REQUEST_TIMEOUT_S):
                    data = await stream.receive_some(RECEIVE_BYTES)
                    if data:
                        parser.feed(data)
                        continue
                return  # closed by the client, or timed out
            response = await self.api.handle(request.method, request.target, request.headers, request.body)
            body = b"" if request.method == "HEAD" else response.body
            await stream.send_all(render_response(response.status, body, response.content_type, request.keep_alive))
            if not request.keep_alive:
                return


async def serve_toxiproxy(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, seed: int | None = None,
                          task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the Toxiproxy API on ``host:port`` (port 0: a free one) until cancelled.

    ``task_status.started`` gets the ``ServerAddress`` once the API listens. ``seed`` seeds the
    draws of toxicity, jitter and slice sizes. Raises ``ToxiproxyStartError`` if the address
    cannot be bound."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as error:
        raise ToxiproxyStartError(f"cannot listen on {join_host_port(host, port)} for the Toxiproxy API: "
                                  f"{error.strerror or error}; pick another --port (0 for a free one) or stop "
                                  f"what holds it") from None
    bound_host, bound_port = listeners[0].socket.getsockname()[:2]
    async with trio.open_nursery() as proxies_nursery:
        api = ToxiproxyApi(proxies_nursery, random.Random(seed))
        server = ToxiproxyServer(api)
        try:
            async with trio.open_nursery() as api_nursery:
                await api_nursery.start(trio.serve_listeners, server.serve_connection, listeners)
                task_status.started(ServerAddress(bound_host, bound_port))
        finally:
            proxies_nursery.cancel_scope.cancel()
