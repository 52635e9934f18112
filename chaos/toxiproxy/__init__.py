"""A Toxiproxy-compatible server (trio) and the toxiproxy-python client, wrapped.

No Toxiproxy binary is installable from this project's registries, so hastore serves Shopify
Toxiproxy 2.x's REST API itself (``serve_toxiproxy``, ``hastore chaos toxiproxy serve``) and
drives it, or a real Toxiproxy named by ``TOXIPROXY_URL``, through ``ToxiproxyClient``.

- ``serve_toxiproxy`` / ``ServerAddress``: the server as a trio task.
- ``toxiproxy_in_thread`` / ``toxiproxy_subprocess`` / ``running_toxiproxy``: a running server
  for synchronous callers, as a context manager yielding its URL.
- ``ToxiproxyClient``: toxiproxy-python with timeouts and typed errors on every call.
"""

from .client import ToxiproxyClient
from .errors import (ToxiproxyBadRequest, ToxiproxyConflict, ToxiproxyError, ToxiproxyNotFound,
                     ToxiproxyRequestError, ToxiproxyServerError, ToxiproxyStartError, ToxiproxyUnavailable)
from .runner import running_toxiproxy, toxiproxy_in_thread, toxiproxy_subprocess
from .server import ServerAddress, ServerStatistics, serve_toxiproxy

__all__ = ["ToxiproxyClient", "ToxiproxyBadRequest", "ToxiproxyConflict", "ToxiproxyError", "ToxiproxyNotFound",
           "ToxiproxyRequestError", "ToxiproxyServerError", "ToxiproxyStartError", "ToxiproxyUnavailable",
           "running_toxiproxy", "toxiproxy_in_thread", "toxiproxy_subprocess", "ServerAddress", "ServerStatistics",
           "serve_toxiproxy"]
