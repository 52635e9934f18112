"""Conformance of the REST API: every endpoint's status codes, JSON shapes and error bodies, as
Shopify Toxiproxy 2.x answers them. The server runs in the test's own trio loop; with
TOXIPROXY_URL set, the same tests run against that (real) Toxiproxy instead."""

from __future__ import annotations

import os
import uuid

import pytest
import trio

from chaos.toxiproxy import serve_toxiproxy
from chaos.toxiproxy.probe import ApiSession, serve_upstream

REAL = bool(os.environ.get("TOXIPROXY_URL"))
builtin_only = pytest.mark.skipif(REAL, reason="hastore's own stricter checks, not Toxiproxy's")
pytestmark = pytest.mark.trio


@pytest.fixture
async def api(nursery):
    url = os.environ.get("TOXIPROXY_URL")
    if not url:
        url = (await nursery.start(serve_toxiproxy, "127.0.0.1", 0)).url
    session = ApiSession(url)
    yield session
    await session.cleanup()


@pytest.fixture
async def upstream(nursery):
    return await nursery.start(serve_upstream)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


async def test_version(api):
    answer = await api.request("GET", "/version")
    assert answer.status == 200
    assert answer.json()["version"].startswith("2.")


async def test_create_show_list_delete_proxy(api, upstream):
    name = unique("p")
    answer = await api.request("POST", "/proxies", {"name": name, "upstream": upstream, "listen": "127.0.0.1:0"})
    assert answer.status == 201
    api.created.append(name)
    proxy = answer.json()
    assert proxy["name"] == name and proxy["upstream"] == upstream and proxy["enabled"] is True
    assert proxy["toxics"] == []
    host, _, port = proxy["listen"].rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert (await api.request("GET", f"/proxies/{name}")).json() == proxy
    listing = await api.request("GET", "/proxies")
    assert listing.status == 200 and listing.json()[name] == proxy
    deleted = await api.request("DELETE", f"/proxies/{name}")
    assert deleted.status == 204 and deleted.body == b""
    assert (await api.request("DELETE", f"/proxies/{name}")).json() == {"error": "proxy not found", "status": 404}


async def test_proxy_errors(api, upstream):
    name = unique("p")
    await api.create_proxy(name, upstream)
    again = await api.request("POST", "/proxies", {"name": name, "upstream": upstream, "listen": "127.0.0.1:0"})
    assert again.status == 409 and again.json() == {"error": "proxy already exists", "status": 409}
    no_name = await api.request("POST", "/proxies", {"upstream": upstream})
    assert no_name.status == 400 and no_name.json() == {"error": "missing required field: name", "status": 400}
    no_upstream = await api.request("POST", "/proxies", {"name": unique("p")})
    assert no_upstream.json() == {"error": "missing required field: upstream", "status": 400}
    bad_json = await api.request("POST", "/proxies", raw=b"{not json")
    assert bad_json.status == 400 and bad_json.json()["error"].startswith("bad request body")
    missing = await api.request("GET", f"/proxies/{unique('absent')}")
    assert missing.status == 404 and missing.json() == {"error": "proxy not found", "status": 404}
    assert (await api.request("POST", f"/proxies/{unique('absent')}", {"enabled": False})).status == 404


async def test_update_disables_and_enables_on_the_same_address(api, upstream):
    name = unique("p")
    host, port = await api.create_proxy(name, upstream)
    down = await api.request("POST", f"/proxies/{name}", {"enabled": False})
    assert down.status == 200 and down.json()["enabled"] is False
    with pytest.raises(OSError):
        await trio.open_tcp_stream(host, port)
    up = await api.request("POST", f"/proxies/{name}", {"enabled": True})
    assert up.status == 200 and up.json()["enabled"] is True and up.json()["listen"] == f"{host}:{port}"
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(b"ECHO\nhello")
        assert await stream.receive_some(100) == b"hello"


async def test_update_upstream(api, upstream, nursery):
    name = unique("p")
    other = await nursery.start(serve_upstream)
    await api.create_proxy(name, upstream)
    answer = await api.request("POST", f"/proxies/{name}", {"upstream": other})
    assert answer.status == 200 and answer.json()["upstream"] == other and answer.json()["enabled"] is True


async def test_toxic_crud(api, upstream):
    name = unique("p")
    await api.create_proxy(name, upstream)
    created = await api.request("POST", f"/proxies/{name}/toxics", {"type": "latency", "attributes": {"latency": 50}})
    assert created.status == 200
    toxic = created.json()
    assert toxic["name"] == "latency_downstream" and toxic["stream"] == "downstream" and toxic["type"] == "latency"
    assert toxic["toxicity"] == 1 and toxic["attributes"] == {"latency": 50, "jitter": 0}
    up = await api.add_toxic(name, "bandwidth", {"rate": 100}, stream="upstream", name="slow_up", toxicity=0.5)
    assert up["name"] == "slow_up" and up["stream"] == "upstream" and up["toxicity"] == 0.5
    listing = (await api.request("GET", f"/proxies/{name}/toxics")).json()
    assert sorted(t["name"] for t in listing) == ["latency_downstream", "slow_up"]
    assert sorted(t["name"] for t in (await api.request("GET", f"/proxies/{name}")).json()["toxics"]) == \
        ["latency_downstream", "slow_up"]
    shown = await api.request("GET", f"/proxies/{name}/toxics/latency_downstream")
    assert shown.status == 200 and shown.json() == toxic
    updated = await api.request("POST", f"/proxies/{name}/toxics/latency_downstream", {"attributes": {"jitter": 5}})
    assert updated.status == 200 and updated.json()["attributes"] == {"latency": 50, "jitter": 5}
    deleted = await api.request("DELETE", f"/proxies/{name}/toxics/latency_downstream")
    assert deleted.status == 204
    assert [t["name"] for t in (await api.request("GET", f"/proxies/{name}/toxics")).json()] == ["slow_up"]


async def test_toxic_errors(api, upstream):
    name = unique("p")
    await api.create_proxy(name, upstream)
    path = f"/proxies/{name}/toxics"
    await api.add_toxic(name, "latency", {"latency": 1})
    again = await api.request("POST", path, {"type": "latency", "attributes": {"latency": 1}})
    assert again.status == 409 and again.json() == {"error": "toxic already exists", "status": 409}
    bad_type = await api.request("POST", path, {"type": "no_such_toxic"})
    assert bad_type.status == 400 and bad_type.json() == {"error": "invalid toxic type", "status": 400}
    bad_stream = await api.request("POST", path, {"type": "latency", "stream": "sideways"})
    assert bad_stream.json() == {"error": "stream was invalid, can be either upstream or downstream",
                                 "status": 400}
    missing = await api.request("GET", f"{path}/nothing")
    assert missing.status == 404 and missing.json() == {"error": "toxic not found", "status": 404}
    assert (await api.request("DELETE", f"{path}/nothing")).status == 404
    assert (await api.request("POST", f"{path}/nothing", {"attributes": {}})).status == 404
    no_proxy = await api.request("GET", f"/proxies/{unique('absent')}/toxics")
    assert no_proxy.json() == {"error": "proxy not found", "status": 404}
    assert (await api.request("POST", f"/proxies/{unique('absent')}/toxics", {"type": "latency"})).status == 404


async def test_populate_creates_and_keeps(api, upstream):
    names = [unique("pop"), unique("pop")]
    body = [{"name": names[0], "upstream": upstream, "listen": "127.0.0.1:0"},
            {"name": names[1], "upstream": upstream, "listen": "127.0.0.1:0", "enabled": False}]
    answer = await api.request("POST", "/populate", body)
    api.created.extend(names)
    assert answer.status == 201
    proxies = {proxy["name"]: proxy for proxy in answer.json()["proxies"]}
    assert proxies[names[0]]["enabled"] is True and proxies[names[1]]["enabled"] is False
    same = await api.request("POST", "/populate", [{"name": names[0], "upstream": upstream,
                                                    "listen": proxies[names[0]]["listen"]}])
    assert same.status == 201 and same.json()["proxies"][0]["listen"] == proxies[names[0]]["listen"]
    bad = await api.request("POST", "/populate", [{"name": unique("pop")}])
    assert bad.status == 400 and bad.json()["error"].startswith("missing required field: upstream")


async def test_reset_enables_and_removes_toxics(api, upstream):
    name = unique("p")
    await api.create_proxy(name, upstream)
    await api.add_toxic(name, "timeout", {"timeout": 0})
    await api.request("POST", f"/proxies/{name}", {"enabled": False})
    answer = await api.request("POST", "/reset")
    assert answer.status == 204
    proxy = (await api.request("GET", f"/proxies/{name}")).json()
    assert proxy["enabled"] is True and proxy["toxics"] == []


async def test_unknown_route_and_browser(api):
    assert (await api.request("GET", "/nothing/here")).status == 404
    browser = await api.request("GET", "/proxies", headers={"User-Agent": "Mozilla/5.0"})
    assert browser.status == 403


@builtin_only
async def test_stricter_checks(api, upstream):
    name = unique("p")
    await api.create_proxy(name, upstream)
    path = f"/proxies/{name}/toxics"
    toxicity = await api.request("POST", path, {"type": "latency", "toxicity": 1.5})
    assert toxicity.status == 400 and "toxicity" in toxicity.json()["error"]
    negative = await api.request("POST", path, {"type": "latency", "attributes": {"latency": -1}})
    assert negative.status == 400 and "latency" in negative.json()["error"]
    text = await api.request("POST", path, {"type": "bandwidth", "attributes": {"rate": "fast"}})
    assert text.status == 400
    bad_listen = await api.request("POST", "/proxies", {"name": unique("p"), "upstream": upstream, "listen": "nope"})
    assert bad_listen.status == 400
    no_json_object = await api.request("POST", "/proxies", [1, 2])
    assert no_json_object.status == 400


@builtin_only
async def test_listen_address_in_use_is_500(api, upstream):
    first = unique("p")
    host, port = await api.create_proxy(first, upstream)
    answer = await api.request("POST", "/proxies", {"name": unique("p"), "upstream": upstream,
                                                    "listen": f"{host}:{port}"})
    assert answer.status == 500 and "address already in use" in answer.json()["error"].lower()
    assert (await api.request("GET", "/proxies")).json().keys() == {first}
