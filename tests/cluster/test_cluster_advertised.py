"""A proxied cluster keeps clients behind the proxies: each node advertises its client proxy
(``advertised_client_address``), so NOT_MASTER replies and ZooKeeper's master record name the
proxy, not the node. Plans without processes; then a real proxied cluster whose master's
client proxy is disabled: a client bootstrapped at a slave follows NOT_MASTER into the cut,
while a direct connection would still write. Last, ``advertised_ha_address``: under the
controller, slaves dial the HA address their master advertises."""

from __future__ import annotations

import json

import pytest
import trio
import yaml

from chaos.toxiproxy import ToxiproxyClient
from chaos.toxiproxy.runner import running_toxiproxy
from node.client import open_producer
from node.cluster.cli import LocalCluster
from node.cluster.plan import plan_processes
from node.cluster.proxies import TOXIPROXY_URL_ENV, ProxyLink, client_proxy
from node.cluster.topology import ClusterConfigError
from node.errors import NodeError

from cluster_helpers import SMALL_STORE, hastore, node_status, small_topology
from test_cluster_proxied import wait_until

NODES = ("g1-n1", "g1-n2", "g1-n3")
CONFIG = {"cluster": "advertised", "store": SMALL_STORE, "startup_timeout_s": 40,
          "controller": {"session_timeout_ms": 1500, "zookeeper": {"tick_ms": 250}}}


@pytest.fixture(autouse=True)
def no_external_toxiproxy(monkeypatch):
    monkeypatch.delenv(TOXIPROXY_URL_ENV, raising=False)


def _node_yaml(directory, node: str) -> dict:
    with open(directory / node / "node.yaml", encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def test_each_node_of_a_proxied_plan_advertises_its_client_proxy(tmp_path):
    plan = plan_processes(str(tmp_path), small_topology(proxied=True), [])
    listen = {link.name: link.listen for link in map(ProxyLink.from_json, plan.proxies["links"])}
    for node in NODES:
        assert _node_yaml(tmp_path, node)["advertised_client_address"] == listen[client_proxy(node)]
        assert "advertised_ha_address" not in _node_yaml(tmp_path, node)   # slaves dial per-pair proxies
    # a static slave's NOT_MASTER names its master's proxy too
    assert _node_yaml(tmp_path, "g1-n2")["master_client_address"] == listen[client_proxy("g1-n1")]
    spec = next(spec for spec in plan.processes if spec.name == "g1-n1")
    assert spec.client_address != listen[client_proxy("g1-n1")]   # the node itself listens elsewhere


def test_an_unproxied_plan_advertises_nothing_and_the_cluster_owns_the_keys(tmp_path):
    plan_processes(str(tmp_path), small_topology(), [])
    slave = _node_yaml(tmp_path, "g1-n2")
    assert "advertised_client_address" not in slave
    assert slave["master_client_address"] == _node_yaml(tmp_path, "g1-n1")["client_address"]
    for key in ("advertised_client_address", "advertised_ha_address"):
        with pytest.raises(ClusterConfigError, match=f"nodes.g1-n2.{key}: set by the cluster"):
            small_topology(nodes={"g1-n2": {key: "127.0.0.1:30000"}})


async def _send(address: str, body: bytes, timeout_s: float = 8.0) -> None:
    """One message sent from ``address`` (a producer follows NOT_MASTER to the master it names)."""
    with trio.fail_after(timeout_s):
        async with open_producer(address, retries_max=2, request_timeout_ms=3_000) as producer:
            await producer.send("advertised", body)


def _sends(address: str, body: bytes) -> str | None:
    """None when the send was acked, else why not."""
    try:
        trio.run(_send, address, body)
    except (NodeError, OSError, trio.TooSlowError) as error:
        return f"{type(error).__name__}: {error}"
    return None


@pytest.mark.integration   # ZooKeeper, controllers, nodes and the proxy server as processes
def test_a_client_following_not_master_is_cut_off_with_the_masters_client_proxy(cluster_dir, tmp_path):
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CONFIG))
    up = hastore("cluster", "up", "--dir", cluster_dir, "--config", str(tmp_path / "cluster.yaml"), "--proxied",
                 "--json", timeout_s=180)
    assert up.returncode == 0, up.stderr
    listen = {proxy["name"]: proxy["listen"] for proxy in json.loads(up.stdout)["proxies"]}
    cluster = LocalCluster(cluster_dir)
    master = cluster.current_master("g1")
    slave = next(node for node in NODES if node != master.node_id)
    master_proxy, slave_proxy = listen[client_proxy(master.node_id)], listen[client_proxy(slave)]
    direct = cluster.node(master.node_id).client_address

    # ZooKeeper's master record, the master's status and a slave's NOT_MASTER all name the proxy
    assert master.client_address == master_proxy and cluster.advertised_client_address(master.node_id) == master_proxy
    status = node_status(direct)
    assert (status["client_address"], status["advertised_client_address"]) == (direct, master_proxy)
    assert _sends(slave_proxy, b"before") is None

    with ToxiproxyClient(cluster.proxy_api_url) as proxies, proxies.down(client_proxy(master.node_id)):
        why = _sends(slave_proxy, b"cut")
        assert why is not None and master_proxy in why, why   # redirected into the disabled proxy
        # the CLI finding the master in the local cluster's ZooKeeper is cut off as well
        cli = hastore("produce", "--dir", cluster_dir, "--topic", "advertised", "cli", timeout_s=60)
        assert cli.returncode != 0, cli.stdout
        assert _sends(direct, b"direct") is None   # the master itself still writes: only its proxy is down
    assert _sends(slave_proxy, b"after") is None
    assert cluster.current_master("g1").node_id == master.node_id   # no failover: clients alone were cut


def _with_key(path: str, key: str, value: str) -> None:
    with open(path, encoding="utf-8") as handle:
        mapping = yaml.safe_load(handle)
    mapping[key] = value
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(mapping, handle, sort_keys=False)


def _replication(address: str) -> dict:
    return node_status(address)["replication"]


@pytest.mark.integration   # ZooKeeper, controllers and nodes as processes, a proxy server in a thread
def test_slaves_dial_the_ha_address_their_master_advertises(cluster_dir):
    cluster = LocalCluster(cluster_dir, small_topology(cluster="advertised-ha", controller=CONFIG["controller"]))
    cluster.up()
    with running_toxiproxy() as url, ToxiproxyClient(url) as proxies:
        # each node advertises a proxy in front of its HA port (as behind NAT), then restarts with it
        advertised = {}
        for spec in cluster.nodes():
            advertised[spec.name] = proxies.create_proxy(f"{spec.name}_ha", spec.ha_address).listen
            _with_key(spec.config_path, "advertised_ha_address", advertised[spec.name])
        old = cluster.current_master("g1").node_id
        for name in sorted(NODES, key=lambda node: node == old):   # the master last: one failover
            cluster.restart(name)
        new = cluster.wait_for_master("g1", 30, not_node=old)
        assert new.ha_address == advertised[new.node_id]             # ZooKeeper's master record
        assert node_status(cluster.node(new.node_id).client_address)["advertised_ha_address"] == new.ha_address
        slaves = [cluster.node(node).client_address for node in NODES if node != new.node_id]
        for slave in slaves:
            wait_until("a slave streaming through the advertised HA address",
                       lambda: (state := _replication(slave))["master_ha_address"] == new.ha_address
                       and state["connected"])
        with proxies.down(f"{new.node_id}_ha"):    # the slaves reach their master through it alone
            for slave in slaves:
                wait_until("a slave cut off from its master", lambda: not _replication(slave)["connected"])
        for slave in slaves:
            wait_until("a slave streaming again", lambda: _replication(slave)["connected"])
