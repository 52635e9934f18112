"""Expected failures of the Toxiproxy-compatible server and of the client wrapper.

Server side, ``ApiError`` is an answer for the HTTP client: a status code and a message, sent
as Toxiproxy's JSON error body ``{"error": "...", "status": N}``. Client side, every non-2xx
answer becomes a ``ToxiproxyRequestError`` subclass chosen by its status, and a server that
cannot be reached (refused, timed out) becomes ``ToxiproxyUnavailable``.
"""

from __future__ import annotations

from chaos.errors import ChaosError


class ToxiproxyError(ChaosError):
    """Base of every error the toxiproxy package raises on purpose."""


class ApiError(ToxiproxyError):
    """A REST request the server refuses: the HTTP status and the message of its error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict:
        """The JSON error body Toxiproxy sends."""
        return {"error": self.message, "status": self.status}


def bad_request(detail: str) -> ApiError:
    """A 400 worded as Toxiproxy words an undecodable or invalid body."""
    return ApiError(400, f"bad request body: {detail}")


def missing_field(field: str) -> ApiError:
    return ApiError(400, f"missing required field: {field}")


PROXY_NOT_FOUND = "proxy not found"
PROXY_EXISTS = "proxy already exists"
TOXIC_NOT_FOUND = "toxic not found"
TOXIC_EXISTS = "toxic already exists"
INVALID_STREAM = "stream was invalid, can be either upstream or downstream"
INVALID_TOXIC_TYPE = "invalid toxic type"


class ToxiproxyStartError(ToxiproxyError):
    """The server could not start (its API address is taken or invalid)."""


class ToxiproxyUnavailable(ToxiproxyError):
    """The Toxiproxy API did not answer in time or refused the connection."""


class ToxiproxyRequestError(ToxiproxyError):
    """The Toxiproxy API answered a request with a non-2xx status."""

    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        super().__init__(f"toxiproxy {method} {path} answered {status}: {message}")
        self.method = method
        self.path = path
        self.status = status
        self.message = message


class ToxiproxyBadRequest(ToxiproxyRequestError):
    """400: the request's body or fields are invalid (see the message)."""


class ToxiproxyNotFound(ToxiproxyRequestError):
    """404: no proxy or toxic of that name (list them with GET /proxies)."""


class ToxiproxyConflict(ToxiproxyRequestError):
    """409: a proxy or toxic of that name exists already (delete it first, or pick another name)."""


class ToxiproxyServerError(ToxiproxyRequestError):
    """Any other non-2xx answer, 5xx above all (a listen address in use, an internal error)."""


def request_error(method: str, path: str, status: int, message: str) -> ToxiproxyRequestError:
    """The typed error for a non-2xx answer."""
    kind = {400: ToxiproxyBadRequest, 404: ToxiproxyNotFound, 409: ToxiproxyConflict}.get(status, ToxiproxyServerError)
    return kind(method, path, status, message)
