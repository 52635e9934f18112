"""A proxied local cluster: every link of a running LocalCluster routed through a Toxiproxy
proxy of its own, so that nemeses can cut or poison one link at a time.

Proxies (names and plan from node.cluster.proxies, the ones chaos.nemesis cuts):

    client_to_NODE          clients -> NODE's client port
    SLAVE_to_MASTER_ha      SLAVE's HA client -> MASTER's HA port, for every ordered pair of a
                            group (so after any failover the links to the new master are proxied)
    NODE_to_zk              NODE's ZooKeeper session -> ZooKeeper
    CONTROLLER_to_zk        a controller's ZooKeeper session -> ZooKeeper

``open_proxies`` on a cluster started proxied (``hastore cluster up --proxied``) uses the
proxies it has for good: a client of its proxy server, and each node's client proxy; nothing
is restarted or undone. On any other cluster it keeps the proxies for the block only: it
creates them (on a Toxiproxy started for the block, or ``TOXIPROXY_URL``), rewrites each
node's node.yaml (``zk_hosts``: its ZooKeeper proxy; ``peer_ha_addresses``: each peer's HA
address -> its pair proxy; ``advertised_client_address``: its client proxy, so that NOT_MASTER
replies and ZooKeeper's master records send clients through the proxies; a static slave's
``master_client_address``: its master's client proxy), restarts the nodes one at a time through LocalCluster, and writes
DIR/chaos/proxies.json. On exit it puts the original node.yaml back and restarts the nodes
again, so the cluster no longer depends on proxies that are gone. There the controllers keep
the ZooKeeper address they were started with, so their proxies carry no traffic: start the
cluster with --proxied to have them dial ZooKeeper through their proxies.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Callable, Iterator

import yaml

from node.cluster import LocalCluster
from node.cluster.proxies import ProxyLink, client_proxies, node_routes, plan_links

from .errors import RunError
from .nemesis import client_proxy
from .toxiproxy import ToxiproxyClient, ToxiproxyError, running_toxiproxy

PROXIES_FILE = "proxies.json"
MASTER_TIMEOUT_S = 60.0

__all__ = ["ProxyLink", "plan_proxies", "node_overrides", "open_proxies"]


def plan_proxies(nodes: list[tuple[str, str, str, str]], zookeeper: str | None, controllers: list[str]
                 ) -> tuple[ProxyLink, ...]:
    """The proxies of a cluster. ``nodes``: (node id, group, client address, HA address);
    ``zookeeper``: its client address (None in static mode)."""
    return plan_links(nodes, zookeeper, controllers)


def node_overrides(node: str, links: tuple[ProxyLink, ...], ha_of: dict[str, str],
                   master_client_address: str | None = None) -> dict:
    """The node.yaml keys that route ``node``'s own links through its proxies (``links`` with
    their listen addresses), and that make it advertise its client proxy
    (``advertised_client_address``, named in its NOT_MASTER replies and ZooKeeper records), so
    that a client following a redirect goes through the proxy there too. A static slave's
    ``master_client_address`` (given when it has one) becomes its master's client proxy."""
    zk, peers = node_routes(node, links, ha_of)
    overrides = {"peer_ha_addresses": peers, **({"zk_hosts": zk} if zk else {})}
    advertised = client_proxies(links).get(node)
    if advertised:
        overrides["advertised_client_address"] = advertised
    proxy_of_client = {link.upstream: link.listen for link in links if link.kind == "client" and link.listen}
    if master_client_address in proxy_of_client:
        overrides["master_client_address"] = proxy_of_client[master_client_address]
    return overrides


@contextmanager
def open_proxies(cluster: LocalCluster) -> Iterator[tuple[ToxiproxyClient, Callable[[str], str]]]:
    """Route the running ``cluster`` through proxies for the block; yield (the Toxiproxy
    client, node id -> the proxied client address)."""
    if cluster.proxied:   # started with --proxied: its proxies last, and every link already uses them
        listen = {link.name: link.listen for link in cluster.proxy_links()}
        with ToxiproxyClient(cluster.proxy_api_url) as client:
            try:
                client.version()   # fail now, not in the first fault, when the proxy server is gone
            except ToxiproxyError as error:
                raise RunError(f"the proxy server of the cluster in {cluster.directory} does not answer ({error}); "
                               f"start it again with `hastore cluster restart toxiproxy --dir {cluster.directory}`"
                               ) from None
            yield client, (lambda node_id: listen[client_proxy(node_id)])
        return
    nodes = [(s.name, s.group, s.client_address, s.ha_address) for s in cluster.nodes()]
    zookeeper = cluster.zk_hosts if cluster.topology.controller.enabled else None
    controllers = [s.name for s in cluster.specs if s.kind == "controller"]
    links = plan_proxies(nodes, zookeeper, controllers)
    with running_toxiproxy(subprocess_server=True) as url, ToxiproxyClient(url) as client:
        listen = {}
        for link in links:
            proxy = client.create_proxy(link.name, link.upstream)
            listen[link.name] = proxy.listen
        links = tuple(ProxyLink(l.name, l.upstream, l.kind, l.owner, l.peer, listen[l.name]) for l in links)
        originals = {}
        listing_path = os.path.join(cluster.directory, "chaos", PROXIES_FILE)
        try:
            ha_of = {node: ha for node, _, _, ha in nodes}
            for node, *_ in nodes:
                originals[node] = _rewrite(cluster, node, lambda name, mapping: node_overrides(
                    name, links, ha_of, mapping.get("master_client_address")))
            _restart_nodes(cluster, [node for node, *_ in nodes])
            os.makedirs(os.path.dirname(listing_path), exist_ok=True)
            with open(listing_path, "w", encoding="utf-8") as handle:
                json.dump({"toxiproxy": url, "proxies": [{"name": l.name, "listen": listen[l.name],
                                                          "upstream": l.upstream, "kind": l.kind, "owner": l.owner,
                                                          "peer": l.peer} for l in links]}, handle, indent=2)
            yield client, (lambda node_id: listen[client_proxy(node_id)])
        finally:
            client.reset()
            for node, text in originals.items():
                with open(cluster.node(node).config_path, "w", encoding="utf-8") as handle:
                    handle.write(text)
            if originals:
                _restart_nodes(cluster, list(originals))
            if os.path.exists(listing_path):
                os.remove(listing_path)


def _rewrite(cluster: LocalCluster, node: str, overrides: Callable[[str, dict], dict]) -> str:
    """Apply ``overrides(node, its mapping)`` to ``node``'s node.yaml; its original text."""
    path = cluster.node(node).config_path
    with open(path, encoding="utf-8") as handle:
        original = handle.read()
    mapping = yaml.safe_load(original)
    mapping = {**mapping, **overrides(node, mapping)}
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("# routed through proxies by `hastore chaos run --proxied`; restored after it\n"
                     + yaml.safe_dump(mapping, sort_keys=False))
    return original


def _restart_nodes(cluster: LocalCluster, nodes: list[str]) -> None:
    """Restart each node (slaves first), waiting for every group's master after each."""
    groups = {spec.group for spec in cluster.nodes()}
    masters = set()
    for group in groups:
        try:
            masters.add(cluster.current_master(group).node_id)
        except Exception:   # no master now: the order does not matter then
            pass
    for node in sorted(nodes, key=lambda name: name in masters):
        cluster.restart(node)
        for group in groups:
            try:
                cluster.wait_for_master(group, MASTER_TIMEOUT_S)
            except Exception as error:
                raise RunError(f"group {group} has no master after restarting {node} through proxies: {error}") \
                    from None
