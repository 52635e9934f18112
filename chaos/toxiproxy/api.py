"""The REST API of Shopify's Toxiproxy 2.x over the proxies this server holds, free of HTTP I/O:
``ToxiproxyApi.handle`` takes a method, a path, headers and a body and returns a ``Response``.

| route                               | method       | success                    |
|-------------------------------------|--------------|----------------------------|
| /version                            | GET          | 200 {"version": "..."}     |
| /reset                              | POST         | 204 (enable all, remove all toxics) |
| /proxies                            | GET          | 200 {name: proxy}          |
| /proxies                            | POST         | 201 proxy                  |
| /populate                           | POST         | 201 {"proxies": [...]}     |
| /proxies/{proxy}                    | GET          | 200 proxy                  |
| /proxies/{proxy}                    | POST, PATCH  | 200 proxy (enabled, listen, upstream) |
| /proxies/{proxy}                    | DELETE       | 204                        |
| /proxies/{proxy}/toxics             | GET          | 200 [toxic]                |
| /proxies/{proxy}/toxics             | POST         | 200 toxic                  |
| /proxies/{proxy}/toxics/{toxic}     | GET          | 200 toxic                  |
| /proxies/{proxy}/toxics/{toxic}     | POST, PATCH  | 200 toxic (attributes, toxicity) |
| /proxies/{proxy}/toxics/{toxic}     | DELETE       | 204                        |

Errors are ``{"error": "...", "status": N}`` with Toxiproxy's messages: 404 proxy/toxic not
found, 409 already exists, 400 bad body or missing field, 500 a listen address that cannot be
bound. Requests from browsers (User-Agent ``Mozilla/...``) get 403, as Toxiproxy does, so a web
page cannot drive the API. Where Toxiproxy takes no position, this server is stricter: a
proxy without ``listen`` listens on 127.0.0.1 (not every interface), toxicity must lie in
[0, 1] and attributes must be non-negative integers.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from urllib.parse import unquote

import trio

from .errors import PROXY_EXISTS, PROXY_NOT_FOUND, ApiError, bad_request, missing_field
from .proxy import Proxy
from .toxics import parse_new_toxic, parse_toxic_update

VERSION = "2.12.0"
DEFAULT_LISTEN = "127.0.0.1:0"
JSON_TYPE = "application/json"


@dataclass(frozen=True)
class Response:
    """An HTTP answer: status, body bytes and content type."""

    status: int
    body: bytes = b""
    content_type: str = JSON_TYPE


def json_response(status: int, value) -> Response:
    return Response(status, json.dumps(value).encode())


def _decode(body: bytes):
    if not body.strip():
        raise bad_request("EOF")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request(str(error)) from None


def _text_field(body: dict, key: str, default: str) -> str:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string, not {value!r}")
    return value


def _enabled_field(body: dict, default: bool) -> bool:
    value = body.get("enabled", default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"enabled must be true or false, not {value!r}")
    return value


class ToxiproxyApi:
    """The proxies of one server and the REST operations on them.

    Changes are serialised by one lock: each runs to completion (listeners bound or closed)
    before the next starts. Proxies' tasks run in ``nursery``; ``rng`` draws toxicities,
    jitter and slice sizes (seed it for a reproducible run)."""

    def __init__(self, nursery: trio.Nursery, rng: random.Random) -> None:
        self.proxies: dict[str, Proxy] = {}
        self._nursery = nursery
        self._rng = rng
        self._lock = trio.Lock()

    async def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        """Answer one request."""
        if headers.get("user-agent", "").startswith("Mozilla/"):
            return Response(403, b"User agent not allowed\n", "text/plain; charset=utf-8")
        parts = [unquote(part) for part in path.split("?", 1)[0].strip("/").split("/")]
        route = self._route(method, parts)
        if route is None:
            return Response(404, b"404 page not found\n", "text/plain; charset=utf-8")
        if route == "method":
            return Response(405, b"", "text/plain; charset=utf-8")
        handler, args = route
        try:
            async with self._lock:
                return await handler(*args, body)
        except ApiError as error:
            return json_response(error.status, error.body())

    def _route(self, method: str, parts: list[str]):
        routes = {
            ("version",): {"GET": self._version},
            ("reset",): {"POST": self._reset},
            ("populate",): {"POST": self._populate},
            ("proxies",): {"GET": self._proxy_index, "POST": self._proxy_create},
        }
        if len(parts) == 2 and parts[0] == "proxies":
            table, args = {"GET": self._proxy_show, "POST": self._proxy_update, "PATCH": self._proxy_update,
                           "DELETE": self._proxy_delete}, (parts[1],)
        elif len(parts) == 3 and parts[0] == "proxies" and parts[2] == "toxics":
            table, args = {"GET": self._toxic_index, "POST": self._toxic_create}, (parts[1],)
        elif len(parts) == 4 and parts[0] == "proxies" and parts[2] == "toxics":
            table, args = {"GET": self._toxic_show, "POST": self._toxic_update, "PATCH": self._toxic_update,
                           "DELETE": self._toxic_delete}, (parts[1], parts[3])
        elif tuple(parts) in routes:
            table, args = routes[tuple(parts)], ()
        else:
            return None
        if method == "HEAD" and "GET" in table:
            method = "GET"
        return (table[method], args) if method in table else "method"

    def _proxy(self, name: str) -> Proxy:
        try:
            return self.proxies[name]
        except KeyError:
            raise ApiError(404, PROXY_NOT_FOUND) from None

    # -- server -------------------------------------------------------------------------
    async def _version(self, body: bytes) -> Response:
        return Response(200, json.dumps({"version": VERSION}).encode() + b"\n", "application/json;charset=utf-8")

    async def _reset(self, body: bytes) -> Response:
        for proxy in self.proxies.values():
            await proxy.start()
            proxy.toxics.clear()
        return Response(204)

    async def close_all(self) -> None:
        """Stop every proxy (the server is shutting down)."""
        for proxy in self.proxies.values():
            await proxy.stop()

    # -- proxies ------------------------------------------------------------------------
    async def _proxy_index(self, body: bytes) -> Response:
        return json_response(200, {name: proxy.to_json() for name, proxy in self.proxies.items()})

    def _proxy_fields(self, entry, where: str = "") -> tuple[str, str, str, bool]:
        if not isinstance(entry, dict):
            raise bad_request(f"expected a JSON object{where}")
        name = _text_field(entry, "name", "")
        upstream = _text_field(entry, "upstream", "")
        if not name:
            raise missing_field(f"name{where}")
        if not upstream:
            raise missing_field(f"upstream{where}")
        listen = _text_field(entry, "listen", "") or DEFAULT_LISTEN
        return name, listen, upstream, _enabled_field(entry, True)

    async def _proxy_create(self, body: bytes) -> Response:
        name, listen, upstream, enabled = self._proxy_fields(_decode(body))
        if name in self.proxies:
            raise ApiError(409, PROXY_EXISTS)
        proxy = Proxy(name, listen, upstream, nursery=self._nursery, rng=self._rng)
        if enabled:
            await proxy.start()
        self.proxies[name] = proxy
        return json_response(201, proxy.to_json())

    async def _populate(self, body: bytes) -> Response:
        try:
            entries = _decode(body)
            if not isinstance(entries, list):
                raise bad_request("expected a JSON array of proxies")
            wanted = [self._proxy_fields(entry, f" at proxy {index + 1}") for index, entry in enumerate(entries)]
            names = [fields[0] for fields in wanted]
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise bad_request(f"duplicate proxy name {duplicates[0]!r}")
            populated = [await self._add_or_replace(*fields) for fields in wanted]
        except ApiError as error:
            return json_response(error.status, {**error.body(), "proxies": None})
        return json_response(201, {"proxies": [proxy.to_json() for proxy in populated]})

    async def _add_or_replace(self, name: str, listen: str, upstream: str, enabled: bool) -> Proxy:
        existing = self.proxies.get(name)
        if existing is not None:
            if existing.listen == listen and existing.upstream == upstream:
                return existing
            await existing.stop()
            del self.proxies[name]
        proxy = Proxy(name, listen, upstream, nursery=self._nursery, rng=self._rng)
        if enabled:
            await proxy.start()
        self.proxies[name] = proxy
        return proxy

    async def _proxy_show(self, name: str, body: bytes) -> Response:
        return json_response(200, self._proxy(name).to_json())

    async def _proxy_update(self, name: str, body: bytes) -> Response:
        proxy = self._proxy(name)
        fields = _decode(body)
        if not isinstance(fields, dict):
            raise bad_request("expected a JSON object")
        listen = _text_field(fields, "listen", proxy.listen) or proxy.listen
        upstream = _text_field(fields, "upstream", proxy.upstream) or proxy.upstream
        enabled = _enabled_field(fields, proxy.enabled)
        if listen != proxy.listen or upstream != proxy.upstream:
            Proxy(name, listen, upstream, nursery=self._nursery, rng=self._rng)  # validates both addresses
            await proxy.stop()
            proxy.listen, proxy.upstream = listen, upstream
        if enabled:
            await proxy.start()
        else:
            await proxy.stop()
        return json_response(200, proxy.to_json())

    async def _proxy_delete(self, name: str, body: bytes) -> Response:
        proxy = self._proxy(name)
        await proxy.stop()
        del self.proxies[name]
        return Response(204)

    # -- toxics -------------------------------------------------------------------------
    async def _toxic_index(self, name: str, body: bytes) -> Response:
        return json_response(200, [spec.to_json() for spec in self._proxy(name).toxics.all()])

    async def _toxic_create(self, name: str, body: bytes) -> Response:
        proxy = self._proxy(name)
        spec = parse_new_toxic(_decode(body))
        proxy.toxics.add(spec)
        return json_response(200, spec.to_json())

    async def _toxic_show(self, name: str, toxic: str, body: bytes) -> Response:
        return json_response(200, self._proxy(name).toxics.get(toxic).to_json())

    async def _toxic_update(self, name: str, toxic: str, body: bytes) -> Response:
        toxics = self._proxy(name).toxics
        spec = parse_toxic_update(toxics.get(toxic), _decode(body))
        toxics.replace(spec)
        return json_response(200, spec.to_json())

    async def _toxic_delete(self, name: str, toxic: str, body: bytes) -> Response:
        self._proxy(name).toxics.remove(toxic)
        return Response(204)
