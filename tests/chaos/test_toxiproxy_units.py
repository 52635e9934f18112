"""Pure parts of the Toxiproxy server: the HTTP request parser, toxic specs and their checks,
the slicer's cut, and a direction's toxic chain on in-memory time (autojump clock)."""

from __future__ import annotations

import random

import pytest
import trio

from chaos.toxiproxy.errors import ApiError
from chaos.toxiproxy.http import HttpError, RequestParser, render_response
from chaos.toxiproxy.proxy import ToxicCollection, split_host_port
from chaos.toxiproxy.toxics import parse_new_toxic, parse_toxic_update, slice_sizes


def test_parser_takes_requests_fed_in_pieces():
    parser = RequestParser()
    raw = b'POST /proxies HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n\r\n{"name": "a"}GET /version HTTP/1.1\r\n\r\n'
    for index in range(len(raw) - 5):
        parser.feed(raw[index:index + 1])
        if index < 60:
            assert parser.next_request() is None
    parser.feed(raw[len(raw) - 5:])
    first = parser.next_request()
    assert (first.method, first.target, first.body, first.keep_alive) == ("POST", "/proxies", b'{"name": "a"}', True)
    second = parser.next_request()
    assert (second.method, second.target, second.body) == ("GET", "/version", b"")
    assert parser.next_request() is None and parser.idle


@pytest.mark.parametrize("raw, status", [
    (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 5000 + b"\r\n", 431),
    (b"GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
    (b"NONSENSE\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
])
def test_parser_refuses_what_it_cannot_bound(raw, status):
    parser = RequestParser()
    parser.feed(raw)
    with pytest.raises(HttpError) as raised:
        parser.next_request()
    assert raised.value.status == status


def test_connection_close_and_http_1_0():
    parser = RequestParser()
    parser.feed(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\nGET / HTTP/1.0\r\n\r\n")
    assert parser.next_request().keep_alive is False
    assert parser.next_request().keep_alive is False
    assert render_response(204, b"", "x", False) == b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"


def test_toxic_defaults_and_update():
    spec = parse_new_toxic({"type": "slicer", "attributes": {"average_size": 10, "delay": 5, "unknown": 1}})
    assert (spec.name, spec.stream, spec.toxicity) == ("slicer_downstream", "downstream", 1.0)
    assert dict(spec.attributes) == {"average_size": 10, "size_variation": 0, "delay": 5}
    updated = parse_toxic_update(spec, {"attributes": {"size_variation": 3}, "toxicity": 0.25, "name": "ignored"})
    assert updated.name == spec.name and updated.toxicity == 0.25
    assert dict(updated.attributes) == {"average_size": 10, "size_variation": 3, "delay": 5}


@pytest.mark.parametrize("body, message", [
    ({"type": "latency", "stream": "both"}, "stream was invalid"),
    ({"type": "nope"}, "invalid toxic type"),
    ({"type": "latency", "toxicity": -0.1}, "toxicity"),
    ({"type": "latency", "toxicity": True}, "toxicity"),
    ({"type": "latency", "attributes": {"latency": 1.5}}, "latency"),
    ({"type": "latency", "attributes": []}, "attributes"),
    ([], "object"),
])
def test_toxic_checks(body, message):
    with pytest.raises(ApiError) as raised:
        parse_new_toxic(body)
    assert raised.value.status == 400 and message in raised.value.message


def test_slice_sizes_cover_everything_within_bounds():
    rng = random.Random(7)
    for total in (0, 1, 99, 100, 101, 5000, 65536):
        sizes = slice_sizes(total, 100, 20, rng)
        assert sum(sizes) == total
        assert all(1 <= size <= 120 for size in sizes)
        assert all(size >= 80 for size in sizes[:-1])
    assert slice_sizes(500, 0, 0, rng) == [500]


def test_addresses():
    assert split_host_port("127.0.0.1:8474", "listen") == ("127.0.0.1", 8474)
    assert split_host_port("[::1]:0", "listen") == ("::1", 0)
    for bad in ("nope", "host:", "host:99999", "host:x"):
        with pytest.raises(ApiError):
            split_host_port(bad, "listen")


@pytest.mark.trio
async def test_collection_orders_versions_and_signals():
    toxics = ToxicCollection()
    changed = toxics.changed("downstream")
    first = parse_new_toxic({"type": "latency", "name": "a"})
    toxics.add(first)
    assert changed.is_set() and toxics.version("downstream") == 1 and toxics.version("upstream") == 0
    toxics.add(parse_new_toxic({"type": "timeout", "name": "b", "stream": "upstream"}))
    assert [spec.name for spec in toxics.all()] == ["b", "a"]  # upstream chain first, as Toxiproxy lists
    with pytest.raises(ApiError) as raised:
        toxics.add(parse_new_toxic({"type": "bandwidth", "name": "a"}))
    assert raised.value.status == 409
    toxics.replace(parse_toxic_update(first, {"attributes": {"latency": 9}}))
    assert toxics.get("a").attribute("latency") == 9 and toxics.chain("downstream")[0] is not first
    toxics.remove("a")
    with pytest.raises(ApiError):
        toxics.get("a")
    toxics.clear()
    assert toxics.all() == []
    await trio.lowlevel.checkpoint()
