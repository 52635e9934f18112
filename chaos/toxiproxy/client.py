"""toxiproxy-python, wrapped: every HTTP call has a timeout and every non-2xx answer raises.

The library (package ``toxiproxy``) sends each request through module-level ``requests.get``
/ ``post`` / ``delete`` calls in ``toxiproxy.api``, with no timeout, against a host and port
kept in class attributes of ``APIConsumer``; it raises for 400, 404 and 409 only, and lets a
500 pass as if it were an answer. This module replaces the ``requests`` name *in that module
only* with a transport that:

- sends through a ``requests.Session`` of the client making the call, with its timeout
  (connect and read) and no retries;
- points the request at the client's base URL (so two clients in one process, each on its own
  server, do not share the library's global host and port);
- raises ``ToxiproxyBadRequest`` / ``ToxiproxyNotFound`` / ``ToxiproxyConflict`` /
  ``ToxiproxyServerError`` for any non-2xx answer (message from the ``{"error": ...}`` body)
  and ``ToxiproxyUnavailable`` when the server cannot be reached in time.

The client making a call is found through a context variable set for the call's duration, so
threads using different clients do not mix. The library's own exceptions (``ProxyExists``
raised before any request, for instance) are turned into the same typed errors.

``ToxiproxyClient()`` talks to ``TOXIPROXY_URL`` if set, else to http://127.0.0.1:8474.
"""

from __future__ import annotations

import contextvars
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit

import requests
import toxiproxy.api as toxiproxy_api
from toxiproxy import Toxiproxy
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists
from toxiproxy.proxy import Proxy
from toxiproxy.toxic import Toxic

from .errors import ToxiproxyConflict, ToxiproxyUnavailable, request_error

DEFAULT_URL = "http://127.0.0.1:8474"
DEFAULT_TIMEOUT_S = 5.0
TOXIPROXY_URL_ENV = "TOXIPROXY_URL"


@dataclass(frozen=True)
class _Binding:
    base_url: str
    session: requests.Session
    timeout_s: float


_current: contextvars.ContextVar[_Binding | None] = contextvars.ContextVar("toxiproxy_binding", default=None)
_fallback = _Binding(DEFAULT_URL, requests.Session(), DEFAULT_TIMEOUT_S)


class _Transport:
    """Stands in for ``requests`` inside ``toxiproxy.api``: timeouts, base URL, typed errors."""

    def get(self, url, params=None, **kwargs):
        return self._send("GET", url, params=params, **kwargs)

    def post(self, url, data=None, json=None, **kwargs):
        return self._send("POST", url, data=data, json=json, **kwargs)

    def delete(self, url, **kwargs):
        return self._send("DELETE", url, **kwargs)

    @staticmethod
    def _send(method: str, url: str, **kwargs) -> requests.Response:
        binding = _current.get() or _fallback
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        kwargs.setdefault("timeout", (binding.timeout_s, binding.timeout_s))
        try:
            response = binding.session.request(method, binding.base_url + path, **kwargs)
        except requests.Timeout:
            raise ToxiproxyUnavailable(f"toxiproxy {method} {path}: no answer from {binding.base_url} within "
                                       f"{binding.timeout_s} s") from None
        except requests.ConnectionError as error:
            raise ToxiproxyUnavailable(f"toxiproxy {method} {path}: cannot reach {binding.base_url} ({error}); "
                                       f"is the server running (hastore chaos toxiproxy serve, or set "
                                       f"{TOXIPROXY_URL_ENV})?") from None
        if not 200 <= response.status_code < 300:
            raise request_error(method, path, response.status_code, _error_message(response))
        return response


def _error_message(response: requests.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    return response.text.strip()


toxiproxy_api.requests = _Transport()


class ToxiproxyClient:
    """A Toxiproxy server, driven through toxiproxy-python with timeouts and typed errors."""

    def __init__(self, url: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        base_url = (url or os.environ.get(TOXIPROXY_URL_ENV) or DEFAULT_URL).rstrip("/")
        if "://" not in base_url:
            base_url = f"http://{base_url}"
        session = requests.Session()
        session.mount("http://", requests.adapters.HTTPAdapter(max_retries=0))
        self.url = base_url
        self._binding = _Binding(base_url, session, timeout_s)
        self._library = Toxiproxy()

    @contextmanager
    def _bound(self) -> Iterator[None]:
        token = _current.set(self._binding)
        try:
            yield
        except ProxyExists as error:
            raise ToxiproxyConflict("POST", "/proxies", 409, str(error)) from None
        except (NotFound, InvalidToxic) as error:  # only raised through our transport, which raises first
            raise AssertionError(f"toxiproxy-python raised {error!r} past the transport") from error
        finally:
            _current.reset(token)

    def close(self) -> None:
        self._binding.session.close()

    def __enter__(self) -> "ToxiproxyClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- server -------------------------------------------------------------------------
    def version(self) -> str:
        """The server's version (Toxiproxy >= 2.6 answers JSON, older ones plain text)."""
        with self._bound():
            text = toxiproxy_api.APIConsumer.get("/version").text.strip()
        try:
            return json.loads(text)["version"]
        except (ValueError, KeyError, TypeError):
            return text

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        with self._bound():
            self._library.reset()

    # -- proxies ------------------------------------------------------------------------
    def proxies(self) -> dict[str, Proxy]:
        with self._bound():
            return self._library.proxies()

    def proxy(self, name: str) -> Proxy:
        """The proxy named so (ToxiproxyNotFound if there is none)."""
        with self._bound():
            return Proxy(**toxiproxy_api.APIConsumer.get(f"/proxies/{name}").json())

    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0", enabled: bool = True) -> Proxy:
        """Create a proxy; its ``listen`` is the bound address (port 0 picks a free one)."""
        with self._bound():
            return self._library.create(upstream=upstream, name=name, listen=listen, enabled=enabled)

    def destroy_proxy(self, name: str) -> None:
        with self._bound():
            self.proxy(name).destroy()

    def destroy_all(self) -> None:
        with self._bound():
            self._library.destroy_all()

    def populate(self, proxies: list[dict]) -> list[dict]:
        """POST /populate: create or replace these proxies at once (the server's JSON)."""
        with self._bound():
            return toxiproxy_api.APIConsumer.post("/populate", json=proxies).json()["proxies"]

    def update_proxy(self, name: str, *, enabled: bool | None = None, listen: str | None = None,
                     upstream: str | None = None) -> dict:
        """POST /proxies/NAME with the fields given; returns the proxy's JSON."""
        fields = {key: value for key, value in (("enabled", enabled), ("listen", listen), ("upstream", upstream))
                  if value is not None}
        with self._bound():
            return toxiproxy_api.APIConsumer.post(f"/proxies/{name}", json=fields).json()

    def disable(self, name: str) -> None:
        """Take a proxy down: its listener and links close; connecting is refused."""
        with self._bound():
            self.proxy(name).disable()

    def enable(self, name: str) -> None:
        with self._bound():
            self.proxy(name).enable()

    @contextmanager
    def down(self, name: str) -> Iterator[None]:
        """The proxy down for the block, up again after it."""
        self.disable(name)
        try:
            yield
        finally:
            self.enable(name)

    # -- toxics -------------------------------------------------------------------------
    def toxics(self, proxy: str) -> dict[str, Toxic]:
        with self._bound():
            return self.proxy(proxy).toxics()

    def toxic(self, proxy: str, name: str) -> Toxic:
        """The toxic named so (ToxiproxyNotFound if there is none)."""
        with self._bound():
            return Toxic(**toxiproxy_api.APIConsumer.get(f"/proxies/{proxy}/toxics/{name}").json())

    def add_toxic(self, proxy: str, type: str, *, name: str | None = None, stream: str = "downstream",
                  toxicity: float = 1.0, attributes: dict | None = None) -> Toxic:
        """Add a toxic (default name ``TYPE_STREAM``); it acts on open links too."""
        fields = {"type": type, "stream": stream, "toxicity": toxicity, "attributes": attributes or {}}
        if name is not None:
            fields["name"] = name
        with self._bound():
            self.proxy(proxy).add_toxic(**fields)
            return self.toxic(proxy, name or f"{type}_{stream}")

    def update_toxic(self, proxy: str, name: str, *, attributes: dict | None = None,
                     toxicity: float | None = None) -> Toxic:
        """Change a toxic's attributes (those given) and toxicity."""
        fields = {"attributes": attributes or {}}
        if toxicity is not None:
            fields["toxicity"] = toxicity
        with self._bound():
            return Toxic(**toxiproxy_api.APIConsumer.post(f"/proxies/{proxy}/toxics/{name}", json=fields).json())

    def remove_toxic(self, proxy: str, name: str) -> None:
        with self._bound():
            self.proxy(proxy).destroy_toxic(name)
