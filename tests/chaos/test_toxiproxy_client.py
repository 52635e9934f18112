"""The toxiproxy-python wrapper: it drives every endpoint it offers, each call has a timeout,
and every non-2xx answer raises a typed error (the bare library lets a 500 pass). The servers
run in the test's own trio loop; the wrapper's blocking calls run in a worker thread."""

from __future__ import annotations

import os
import uuid
from functools import partial

import pytest
import trio
from toxiproxy.api import APIConsumer

from chaos.toxiproxy import (ToxiproxyBadRequest, ToxiproxyClient, ToxiproxyConflict, ToxiproxyNotFound,
                             ToxiproxyServerError, ToxiproxyUnavailable, serve_toxiproxy)
from chaos.toxiproxy.probe import serve_upstream

pytestmark = pytest.mark.trio
REAL = bool(os.environ.get("TOXIPROXY_URL"))


async def call(function, *args, **kwargs):
    return await trio.to_thread.run_sync(partial(function, *args, **kwargs))


@pytest.fixture
async def client(nursery):
    url = os.environ.get("TOXIPROXY_URL") or (await nursery.start(serve_toxiproxy, "127.0.0.1", 0)).url
    toxiproxy = ToxiproxyClient(url, timeout_s=5.0)
    created = []
    yield toxiproxy, created
    for name in created:
        try:
            await call(toxiproxy.destroy_proxy, name)
        except ToxiproxyNotFound:
            pass
    toxiproxy.close()


@pytest.fixture
async def upstream(nursery):
    return await nursery.start(serve_upstream)


async def echo_once(listen: str) -> bytes:
    host, _, port = listen.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"ECHO\nhi")
        return await stream.receive_some(10)


async def test_wrapper_drives_proxies_and_toxics(client, upstream):
    toxiproxy, created = client
    name = f"w_{uuid.uuid4().hex[:8]}"
    assert (await call(toxiproxy.version)).startswith("2.")
    proxy = await call(toxiproxy.create_proxy, name, upstream)
    created.append(name)
    assert proxy.enabled and proxy.upstream == upstream
    assert name in await call(toxiproxy.proxies)
    assert await echo_once(proxy.listen) == b"hi"
    toxic = await call(toxiproxy.add_toxic, name, "latency", attributes={"latency": 20}, stream="upstream")
    assert (toxic.name, toxic.stream, toxic.attributes) == ("latency_upstream", "upstream", {"latency": 20, "jitter": 0})
    updated = await call(toxiproxy.update_toxic, name, "latency_upstream", attributes={"latency": 30}, toxicity=0.5)
    assert updated.attributes["latency"] == 30 and updated.toxicity == 0.5
    assert set(await call(toxiproxy.toxics, name)) == {"latency_upstream"}
    await call(toxiproxy.remove_toxic, name, "latency_upstream")
    assert await call(toxiproxy.toxics, name) == {}
    await call(toxiproxy.disable, name)
    with pytest.raises(OSError):
        await echo_once(proxy.listen)
    await call(toxiproxy.enable, name)
    assert await echo_once(proxy.listen) == b"hi"
    assert (await call(toxiproxy.update_proxy, name, enabled=False))["enabled"] is False
    await call(toxiproxy.reset)
    assert (await call(toxiproxy.proxy, name)).enabled is True
    populated = await call(toxiproxy.populate, [{"name": f"{name}_pop", "upstream": upstream, "listen": "127.0.0.1:0"}])
    created.append(f"{name}_pop")
    assert populated[0]["name"] == f"{name}_pop"


async def test_down_context_manager(client, upstream):
    toxiproxy, created = client
    name = f"w_{uuid.uuid4().hex[:8]}"
    proxy = await call(toxiproxy.create_proxy, name, upstream)
    created.append(name)
    states = []

    def inside_down():
        with toxiproxy.down(name):
            states.append(toxiproxy.proxy(name).enabled)
        states.append(toxiproxy.proxy(name).enabled)

    await call(inside_down)
    assert states == [False, True]
    assert await echo_once(proxy.listen) == b"hi"


async def test_typed_errors(client, upstream):
    toxiproxy, created = client
    name = f"w_{uuid.uuid4().hex[:8]}"
    await call(toxiproxy.create_proxy, name, upstream)
    created.append(name)
    with pytest.raises(ToxiproxyNotFound) as missing:
        await call(toxiproxy.proxy, f"absent_{name}")
    assert missing.value.status == 404 and missing.value.message == "proxy not found"
    with pytest.raises(ToxiproxyConflict):
        await call(toxiproxy.create_proxy, name, upstream)
    await call(toxiproxy.add_toxic, name, "latency", attributes={"latency": 1})
    with pytest.raises(ToxiproxyConflict) as conflict:
        await call(toxiproxy.add_toxic, name, "latency", attributes={"latency": 1})
    assert conflict.value.message == "toxic already exists"
    with pytest.raises(ToxiproxyBadRequest) as bad:
        await call(toxiproxy.add_toxic, name, "no_such_toxic")
    assert bad.value.message == "invalid toxic type"
    with pytest.raises(ToxiproxyNotFound):
        await call(toxiproxy.remove_toxic, name, "nothing")


async def answer_500(stream: trio.SocketStream) -> None:
    async with stream:
        await stream.receive_some(65536)
        body = b'{"error": "something broke", "status": 500}'
        await stream.send_all(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))


async def never_answer(stream: trio.SocketStream) -> None:
    async with stream:
        await trio.sleep_forever()


async def start_server(nursery, handler) -> str:
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return "http://127.0.0.1:%d" % listeners[0].socket.getsockname()[1]


async def test_server_error_raises_where_the_library_would_not(nursery):
    url = await start_server(nursery, answer_500)
    toxiproxy = ToxiproxyClient(url, timeout_s=2.0)
    with pytest.raises(ToxiproxyServerError) as raised:
        await call(toxiproxy.reset)
    assert raised.value.status == 500 and raised.value.message == "something broke"
    with pytest.raises(ToxiproxyServerError):
        await call(toxiproxy.update_proxy, "any", enabled=True)


async def test_a_silent_server_times_out(nursery):
    url = await start_server(nursery, never_answer)
    toxiproxy = ToxiproxyClient(url, timeout_s=0.3)
    start = trio.current_time()
    with pytest.raises(ToxiproxyUnavailable):
        await call(toxiproxy.proxies)
    assert trio.current_time() - start < 3.0


async def test_refused_is_unavailable():
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connecting is refused
        with pytest.raises(ToxiproxyUnavailable) as raised:
            await call(ToxiproxyClient(f"http://127.0.0.1:{port}", timeout_s=1.0).version)
    assert "TOXIPROXY_URL" in str(raised.value)


@pytest.mark.skipif(REAL, reason="starts two servers of its own")
async def test_two_clients_two_servers_do_not_mix(nursery, upstream, monkeypatch):
    first = (await nursery.start(serve_toxiproxy, "127.0.0.1", 0)).url
    second = (await nursery.start(serve_toxiproxy, "127.0.0.1", 0)).url
    monkeypatch.setenv("TOXIPROXY_URL", second)
    one, two = ToxiproxyClient(first), ToxiproxyClient()
    assert two.url == second
    await call(one.create_proxy, "only_on_first", upstream)
    assert set(await call(one.proxies)) == {"only_on_first"}
    assert await call(two.proxies) == {}
    assert (APIConsumer.host, APIConsumer.port) == ("127.0.0.1", 8474)  # the library's globals stay untouched


@pytest.mark.skipif(REAL, reason="a listen address in use is a 500 on hastore's server")
async def test_listen_in_use_is_a_server_error(client, upstream):
    toxiproxy, created = client
    proxy = await call(toxiproxy.create_proxy, "first", upstream)
    created.append("first")
    with pytest.raises(ToxiproxyServerError) as raised:
        await call(toxiproxy.create_proxy, "second", upstream, listen=proxy.listen)
    assert raised.value.status == 500
