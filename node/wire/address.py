"""Addresses as 'host:port' strings, as configs, replies and command lines carry them."""

from __future__ import annotations


def address_problem(address: object) -> str | None:
    """Why ``address`` is not 'host:port', or None."""
    if not isinstance(address, str):
        return f"must be a 'host:port' string, not {type(address).__name__}"
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return f"must be 'host:port' with a port in [0, 65535], not {address!r}"
    return None


def split_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host, int(port)
