"""A lasting proxied cluster (`hastore cluster up --proxied`) with real processes: every link
through a proxy of its own, controllers and nodes on ZooKeeper through theirs, the HA links
to a new master proxied after a failover, the proxies listed by status, and the proxy server
stopped with the cluster and started again with it."""

from __future__ import annotations

import json
import os
import time

import pytest
import yaml

from chaos.toxiproxy import ToxiproxyClient
from node.cluster.cli import LocalCluster
from node.cluster.proxies import TOXIPROXY_URL_ENV, ha_proxy, zk_proxy

from cluster_helpers import SMALL_STORE, hastore, node_status, process_alive, small_topology

pytestmark = pytest.mark.integration   # ZooKeeper, controllers, nodes and the proxy server as processes

CONFIG = {"cluster": "proxied", "store": SMALL_STORE, "startup_timeout_s": 40,
          "controller": {"session_timeout_ms": 1500, "zookeeper": {"tick_ms": 250}}}
NODES = ("g1-n1", "g1-n2", "g1-n3")
WAIT_S = 30.0


def wait_until(what: str, check, timeout_s: float = WAIT_S):
    """Poll ``check`` until it returns something true (bounded); that value."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as error:   # a process between two states: try again until the bound
            last = error
        else:
            if last:
                return last
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


def controllers(cluster: LocalCluster) -> dict[str, str]:
    """controller name -> active | standby | why it is not in the election."""
    return {item.spec.name: ("active" if item.status["active"] else "standby") if item.status else item.error
            for item in cluster.status() if item.spec.kind == "controller"}


def dialed_master_ha(slave_address: str) -> str | None:
    return node_status(slave_address)["replication"].get("master_ha_address")


@pytest.fixture
def no_external_toxiproxy(monkeypatch):
    monkeypatch.delenv(TOXIPROXY_URL_ENV, raising=False)


def test_a_proxied_cluster_routes_every_link_through_its_own_proxy(cluster_dir, tmp_path, no_external_toxiproxy):
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(CONFIG))
    up = hastore("cluster", "up", "--dir", cluster_dir, "--config", str(tmp_path / "cluster.yaml"), "--proxied",
                 "--json", timeout_s=180)
    assert up.returncode == 0, up.stderr
    started = json.loads(up.stdout)
    listen = {proxy["name"]: proxy["listen"] for proxy in started["proxies"]}
    assert set(listen) == ({f"client_to_{n}" for n in NODES} | {ha_proxy(s, m) for s in NODES for m in NODES if s != m}
                           | {zk_proxy(p) for p in (*NODES, "controller-1", "controller-2")})
    cluster = LocalCluster(cluster_dir)
    server_pid = cluster.pid("toxiproxy")
    assert server_pid and cluster.proxied and started["toxiproxy"] == cluster.proxy_api_url

    # Clients reach each node through its client proxy; each slave dials its master through the
    # proxy of its own pair; each node and controller was given its own ZooKeeper proxy.
    for node in NODES:
        assert node_status(listen[f"client_to_{node}"])["node_id"] == node
    master = cluster.current_master("g1").node_id
    slaves = [node for node in NODES if node != master]
    for slave in slaves:
        assert wait_until(f"{slave} following {master}",
                          lambda: dialed_master_ha(cluster.node(slave).client_address)) == listen[ha_proxy(slave, master)]
        with open(cluster.node(slave).config_path, encoding="utf-8") as handle:
            assert yaml.safe_load(handle)["zk_hosts"] == listen[zk_proxy(slave)]
    for spec in cluster.specs:
        if spec.kind == "controller":
            assert spec.argv[spec.argv.index("--zk") + 1] == listen[zk_proxy(spec.name)]

    with ToxiproxyClient(cluster.proxy_api_url) as proxies:
        # A controller really talks to ZooKeeper through its proxy: cut the active one's, and
        # it loses its session and the other takes over; heal, and it is back as standby.
        before = wait_until("an active controller", lambda: "active" in controllers(cluster).values()
                            and controllers(cluster))
        active = next(name for name, state in before.items() if state == "active")
        other = next(name for name in before if name != active)
        with proxies.down(zk_proxy(active)):
            after = wait_until(f"{other} active once {active} is cut off",
                               lambda: (states := controllers(cluster))[other] == "active" and states)
            assert "has not joined the election" in after[active]
        assert wait_until(f"{active} back", lambda: controllers(cluster)[active] == "standby")

        # The master's own ZooKeeper proxy carries its session: cut it and another node is
        # elected; the HA links to the new master go through the proxies of those pairs.
        with proxies.down(zk_proxy(master)):
            new_master = cluster.wait_for_master("g1", WAIT_S, not_node=master).node_id
        for slave in (node for node in NODES if node != new_master):
            wait_until(f"{slave} following {new_master} through its proxy",
                       lambda: dialed_master_ha(cluster.node(slave).client_address)
                       == listen[ha_proxy(slave, new_master)])

        # status lists the proxies with their state and toxics, as text and JSON
        link = ha_proxy(master, new_master)
        proxies.add_toxic(link, "latency", name="slow", attributes={"latency": 50, "jitter": 0})
        proxies.disable(zk_proxy("controller-2"))
        try:
            status = hastore("cluster", "status", "--dir", cluster_dir, "--json")
            table = hastore("cluster", "status", "--dir", cluster_dir)
        finally:
            proxies.enable(zk_proxy("controller-2"))
            proxies.remove_toxic(link, "slow")
    assert status.returncode == 0 and table.returncode == 0, status.stderr + table.stderr
    listed = {proxy["name"]: proxy for proxy in json.loads(status.stdout)["proxies"]["proxies"]}
    assert set(listed) == set(listen) and all(listed[name]["listen"] == listen[name] for name in listen)
    assert [toxic["name"] for toxic in listed[link]["toxics"]] == ["slow"]
    assert not listed[zk_proxy("controller-2")]["enabled"] and listed[zk_proxy("controller-1")]["enabled"]
    row = next(line for line in table.stdout.splitlines() if line.split()[:1] == [link])
    assert row.split()[1:5] == [listen[link], cluster.node(new_master).ha_address, "yes", "slow"]
    assert f"proxies (Toxiproxy {cluster.proxy_api_url})" in table.stdout

    # a dead proxy server is reported by status, and `cluster restart toxiproxy` brings it back
    # with every proxy on the same address
    cluster.kill("toxiproxy")
    dead = hastore("cluster", "status", "--dir", cluster_dir)
    assert dead.returncode == 0 and "proxy server: Toxiproxy at" in dead.stdout, dead.stdout + dead.stderr
    restart = hastore("cluster", "restart", "toxiproxy", "--dir", cluster_dir)
    assert restart.returncode == 0, restart.stderr
    cluster = LocalCluster(cluster_dir)
    assert cluster.pid("toxiproxy") not in (None, server_pid)
    server_pid = cluster.pid("toxiproxy")
    assert {proxy["name"]: proxy["listen"] for proxy in cluster.proxy_listing() if proxy["present"]} == listen
    # every ZooKeeper session went with the server: a master is elected again, through the proxies
    elected = cluster.wait_for_master("g1", WAIT_S).node_id
    wait_until(f"{elected} master through its proxy",
               lambda: node_status(listen[f"client_to_{elected}"])["role"] == "master")

    # down stops the proxy server with the cluster; up (from cluster.json) brings it all back
    down = hastore("cluster", "down", "--dir", cluster_dir, "--json")
    assert down.returncode == 0, down.stderr
    assert {report["name"]: report["outcome"] for report in json.loads(down.stdout)}["toxiproxy"] == "clean"
    assert not process_alive(server_pid)
    again = hastore("cluster", "up", "--dir", cluster_dir, "--json", timeout_s=180)
    assert again.returncode == 0, again.stderr
    assert {proxy["name"]: proxy["listen"] for proxy in json.loads(again.stdout)["proxies"]} == listen
    restarted = LocalCluster(cluster_dir)
    assert restarted.pid("toxiproxy") not in (None, server_pid)
    assert all(proxy["present"] and proxy["enabled"] for proxy in restarted.proxy_listing())
    # the controller's record names the master before that node has taken the role (or, just
    # after the start, still names the one before `down`): until the node it names serves as master
    wait_until("the recorded master serving as master through its proxy", lambda: node_status(
        listen[f"client_to_{restarted.wait_for_master('g1', WAIT_S).node_id}"])["role"] == "master")
    assert os.path.exists(os.path.join(cluster_dir, "toxiproxy", "toxiproxy.log"))


def test_toxiproxy_url_puts_the_proxies_on_that_server_and_down_removes_them(cluster_dir, monkeypatch):
    from chaos.toxiproxy import toxiproxy_in_thread
    topology = small_topology(nodes_per_group=2, proxied=True)
    with toxiproxy_in_thread() as url, ToxiproxyClient(url) as server:
        server.create_proxy("someone_elses", "127.0.0.1:1")
        monkeypatch.setenv(TOXIPROXY_URL_ENV, url)
        cluster = LocalCluster(cluster_dir, topology)
        try:
            cluster.up()
            monkeypatch.delenv(TOXIPROXY_URL_ENV)   # later commands find the server in cluster.json
            later = LocalCluster(cluster_dir)
            assert later.proxy_api_url == url and [spec.kind for spec in later.specs] == ["node", "node"]
            names = {"client_to_g1-n1", "client_to_g1-n2", "g1-n1_to_g1-n2_ha", "g1-n2_to_g1-n1_ha"}
            assert set(server.proxies()) == names | {"someone_elses"}
            slave_address = later.node("g1-n2").client_address
            assert wait_until("g1-n2 following g1-n1", lambda: dialed_master_ha(slave_address)) == \
                server.proxy("g1-n2_to_g1-n1_ha").listen
            assert node_status(server.proxy("client_to_g1-n1").listen)["role"] == "master"
        finally:
            cluster.down()
        assert set(server.proxies()) == {"someone_elses"}   # the server itself is left running
