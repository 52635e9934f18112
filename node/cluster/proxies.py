"""The proxies of a proxied local cluster (``proxied: true``, ``hastore cluster up --proxied``):
every link through a Toxiproxy proxy of its own, so that one link can be cut or poisoned alone.

    client_to_NODE          clients -> NODE's client port
    SLAVE_to_MASTER_ha      SLAVE's HA client -> MASTER's HA port, for every ordered pair of a
                            group: after any failover the links to the new master are proxied too
    NODE_to_zk              NODE's ZooKeeper session -> ZooKeeper (controller mode)
    CONTROLLER_to_zk        a controller's ZooKeeper session -> ZooKeeper (controller mode)

The names are the ones chaos.nemesis cuts. Each node's node.yaml names its own ZooKeeper
proxy (``zk_hosts``), its pair proxies (``peer_ha_addresses``: a master's HA address ->
the proxy this slave dials instead) and its client proxy as ``advertised_client_address``,
which its NOT_MASTER replies and ZooKeeper records name, so that a client following them
stays behind the proxy; each controller is started with ``--zk`` its proxy. The HA address
stays advertised as it is (each slave has a proxy of its own to it, keyed by it).

The Toxiproxy server is ``hastore chaos toxiproxy serve`` on a free loopback port, run by the
supervisor as one of the cluster's processes (phase -1: first up, last down), or the real
Toxiproxy named by ``TOXIPROXY_URL`` at ``up`` (left running; the cluster's proxies are
deleted from it at ``down``). node/ does not import chaos/: the server is a command, and its
REST API is spoken here with the standard library (``ToxiproxyAPI``: a timeout on every
call, an error for every non-2xx answer).
"""

from __future__ import annotations

import http.client
import json
import os
from dataclasses import asdict, dataclass, replace
from typing import Iterable
from urllib.parse import urlsplit

from ..wire.address import split_address
from .errors import ClusterError
from .ports import free_ports, port_is_free
from .state import ProcessSpec

TOXIPROXY = "toxiproxy"
TOXIPROXY_PHASE = -1
TOXIPROXY_URL_ENV = "TOXIPROXY_URL"
API_TIMEOUT_S = 5.0
API_REPLY_BYTES_MAX = 16 * 1024 * 1024


def client_proxy(node: str) -> str:
    return f"client_to_{node}"


def ha_proxy(slave: str, master: str) -> str:
    return f"{slave}_to_{master}_ha"


def zk_proxy(process: str) -> str:
    return f"{process}_to_zk"


@dataclass(frozen=True, slots=True)
class ProxyLink:
    """One proxy: its name, what it forwards to, whose link it carries, and where it listens."""

    name: str
    upstream: str
    kind: str            # client | ha | zk
    owner: str           # the process whose outgoing link it is (a node, a controller; "clients")
    peer: str            # the process it reaches
    listen: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, item: dict) -> "ProxyLink":
        return cls(**{key: item.get(key) for key in ("name", "upstream", "kind", "owner", "peer", "listen")})


def plan_links(nodes: list[tuple[str, str, str, str]], zookeeper: str | None,
               controllers: list[str]) -> tuple[ProxyLink, ...]:
    """The proxies of a cluster. ``nodes``: (node id, group, client address, HA address);
    ``zookeeper``: its client address (None in static mode)."""
    links = [ProxyLink(client_proxy(node), client, "client", "clients", node) for node, _, client, _ in nodes]
    for slave, group, _, _ in nodes:
        for master, other_group, _, master_ha in nodes:
            if master != slave and other_group == group:
                links.append(ProxyLink(ha_proxy(slave, master), master_ha, "ha", slave, master))
    if zookeeper is not None:
        links += [ProxyLink(zk_proxy(node), zookeeper, "zk", node, "zookeeper") for node, *_ in nodes]
        links += [ProxyLink(zk_proxy(controller), zookeeper, "zk", controller, "zookeeper")
                  for controller in controllers]
    return tuple(links)


def with_listen_addresses(links: Iterable[ProxyLink], host: str, previous: dict[str, str],
                          taken: set[int]) -> tuple[ProxyLink, ...]:
    """Each link with a listen address: the one a previous ``up`` gave it while still free,
    else a fresh free port on ``host``; none on a port in ``taken``."""
    links = list(links)
    chosen: dict[str, str] = {}
    taken = set(taken)
    for link in links:
        old = previous.get(link.name)
        if old is not None:
            port = split_address(old)[1]
            if port not in taken and port_is_free(host, port):
                chosen[link.name] = f"{host}:{port}"
                taken.add(port)
    wanted = [link.name for link in links if link.name not in chosen]
    for name, port in zip(wanted, free_ports(host, len(wanted), exclude=taken)):
        chosen[name] = f"{host}:{port}"
    return tuple(replace(link, listen=chosen[link.name]) for link in links)


def node_routes(node: str, links: Iterable[ProxyLink], ha_of: dict[str, str]) -> tuple[str | None, dict]:
    """(``node``'s ZooKeeper proxy or None, its ``peer_ha_addresses``): the node.yaml keys that
    route its own links through its proxies. ``ha_of``: node id -> its HA address."""
    links = [link for link in links if link.owner == node]
    peers = {ha_of[link.peer]: link.listen for link in links if link.kind == "ha"}
    zk = next((link.listen for link in links if link.kind == "zk"), None)
    return zk, peers


def client_proxies(links: Iterable[ProxyLink]) -> dict[str, str]:
    """node id -> the listen address of its client proxy: the client address the node
    advertises (``advertised_client_address``), so that clients following a NOT_MASTER reply
    or a ZooKeeper master record reach it through its proxy too."""
    return {link.peer: link.listen for link in links if link.kind == "client" and link.listen}


def toxiproxy_spec(directory: str, port: int, hastore: tuple[str, ...]) -> ProcessSpec:
    """The Toxiproxy-compatible server as a process of the cluster (DIR/toxiproxy/toxiproxy.log),
    run as ``hastore chaos toxiproxy serve`` (``hastore``: how to run the CLI)."""
    base_dir = os.path.join(directory, TOXIPROXY)
    os.makedirs(base_dir, exist_ok=True)
    argv = (*hastore, "chaos", "toxiproxy", "serve", "--host", "127.0.0.1", "--port", str(port))
    return ProcessSpec(name=TOXIPROXY, kind=TOXIPROXY, phase=TOXIPROXY_PHASE, argv=argv, config_path=base_dir,
                       log_path=os.path.join(base_dir, "toxiproxy.log"), data_path=base_dir,
                       client_address=f"127.0.0.1:{port}")


class ToxiproxyAPI:
    """Toxiproxy's REST API at ``url``, synchronous: each call bounded by ``timeout_s``; a
    refused connection, a timeout or a non-2xx answer raises ClusterError."""

    def __init__(self, url: str, timeout_s: float = API_TIMEOUT_S) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            raise ClusterError(f"Toxiproxy URL {url!r}: expected http://HOST:PORT")
        self.url = f"http://{parts.hostname}:{parts.port or 8474}"
        self._host, self._port = parts.hostname, parts.port or 8474
        self.timeout_s = timeout_s

    def version(self) -> str:
        text = self._call("GET", "/version").decode(errors="replace").strip()
        try:
            return json.loads(text)["version"]
        except (ValueError, KeyError, TypeError):
            return text

    def populate(self, links: Iterable[ProxyLink]) -> list[dict]:
        """Create (or replace) every link's proxy at once, enabled, no toxics."""
        body = [{"name": link.name, "listen": link.listen, "upstream": link.upstream, "enabled": True}
                for link in links]
        return json.loads(self._call("POST", "/populate", body))["proxies"]

    def proxies(self) -> dict[str, dict]:
        """Every proxy the server holds, by name (name, listen, upstream, enabled, toxics)."""
        return json.loads(self._call("GET", "/proxies"))

    def delete(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{name}")

    def _call(self, method: str, path: str, body: object = None) -> bytes:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        try:
            payload = None if body is None else json.dumps(body).encode()
            connection.request(method, path, body=payload,
                               headers={"Content-Type": "application/json"} if payload else {})
            response = connection.getresponse()
            data = response.read(API_REPLY_BYTES_MAX)
        except OSError as error:
            raise ClusterError(f"Toxiproxy at {self.url}: {method} {path} failed ({error or type(error).__name__}); "
                               f"is it running (`hastore cluster status`, or {TOXIPROXY_URL_ENV})?") from None
        finally:
            connection.close()
        if not 200 <= response.status < 300:
            raise ClusterError(f"Toxiproxy at {self.url}: {method} {path} answered {response.status}: "
                               f"{_error_text(data)}")
        return data


def _error_text(data: bytes) -> str:
    try:
        return str(json.loads(data)["error"])
    except (ValueError, KeyError, TypeError):
        return data.decode(errors="replace").strip()[:200]
