"""A proxied cluster's plan, without processes: a proxy per link with its own port, each
node's node.yaml routed through its own proxies, ports kept across ups, and the status table."""

from __future__ import annotations

import os

import pytest
import yaml

from node.cluster.cli import render_proxies
from node.cluster.errors import ClusterError
from node.cluster.plan import plan_processes
from node.cluster.proxies import TOXIPROXY_URL_ENV, ProxyLink, ToxiproxyAPI, node_routes, plan_links
from node.wire.address import split_address

from cluster_helpers import small_topology


@pytest.fixture(autouse=True)
def no_external_toxiproxy(monkeypatch):
    monkeypatch.delenv(TOXIPROXY_URL_ENV, raising=False)


def test_every_ordered_pair_of_a_group_has_its_own_ha_proxy():
    nodes = [("a1", "a", "c:1", "h:1"), ("a2", "a", "c:2", "h:2"), ("a3", "a", "c:3", "h:3"), ("b1", "b", "c:4", "h:4")]
    links = plan_links(nodes, "z:1", ["controller-1", "controller-2"])
    ha = sorted(link.name for link in links if link.kind == "ha")
    assert ha == ["a1_to_a2_ha", "a1_to_a3_ha", "a2_to_a1_ha", "a2_to_a3_ha", "a3_to_a1_ha", "a3_to_a2_ha"]
    assert {link.name: link.upstream for link in links if link.kind == "zk"} == {
        "a1_to_zk": "z:1", "a2_to_zk": "z:1", "a3_to_zk": "z:1", "b1_to_zk": "z:1",
        "controller-1_to_zk": "z:1", "controller-2_to_zk": "z:1"}
    assert [link.name for link in links if link.kind == "client"] == [
        "client_to_a1", "client_to_a2", "client_to_a3", "client_to_b1"]
    assert ProxyLink.from_json(links[0].to_json()) == links[0]


def test_a_static_proxied_plan_routes_each_slave_through_its_pair_proxies(tmp_path):
    topology = small_topology(proxied=True)
    plan = plan_processes(str(tmp_path), topology, [])
    kinds = [(spec.name, spec.kind, spec.phase) for spec in plan.processes]
    assert kinds[0] == ("toxiproxy", "toxiproxy", -1)
    assert kinds[1:] == [("g1-n1", "node", 0), ("g1-n2", "node", 1), ("g1-n3", "node", 1)]
    toxiproxy = plan.processes[0]
    assert toxiproxy.argv[-7:] == ("chaos", "toxiproxy", "serve", "--host", "127.0.0.1", "--port",
                                   str(split_address(toxiproxy.client_address)[1]))
    assert plan.proxies["api"] == f"http://{toxiproxy.client_address}" and not plan.proxies["external"]
    links = [ProxyLink.from_json(item) for item in plan.proxies["links"]]
    assert len(links) == 3 + 6 and not any(link.kind == "zk" for link in links)   # static: no ZooKeeper
    node_ports = {split_address(a)[1] for spec in plan.processes[1:]
                  for a in (spec.client_address, spec.ha_address, spec.metrics_address)}
    listen_ports = [split_address(link.listen)[1] for link in links]
    assert len(set(listen_ports)) == len(links) and not node_ports & set(listen_ports)
    assert split_address(toxiproxy.client_address)[1] not in node_ports | set(listen_ports)
    ha_of = {spec.name: spec.ha_address for spec in plan.processes[1:]}
    with open(tmp_path / "g1-n2" / "node.yaml", encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    by_name = {link.name: link for link in links}
    assert config["peer_ha_addresses"] == {ha_of["g1-n1"]: by_name["g1-n2_to_g1-n1_ha"].listen,
                                           ha_of["g1-n3"]: by_name["g1-n2_to_g1-n3_ha"].listen}
    assert node_routes("g1-n2", links, ha_of) == (None, config["peer_ha_addresses"])
    assert by_name["client_to_g1-n3"].upstream == plan.processes[3].client_address


def test_proxy_ports_are_kept_across_ups_and_an_unproxied_plan_has_none(tmp_path):
    topology = small_topology(proxied=True)
    first = plan_processes(str(tmp_path), topology, [])
    again = plan_processes(str(tmp_path), topology, first.processes, first.proxies)
    assert again.proxies == first.proxies
    assert [spec.client_address for spec in again.processes] == [spec.client_address for spec in first.processes]
    plain = plan_processes(str(tmp_path / "plain"), small_topology(), [])
    assert plain.proxies is None and all(spec.kind == "node" for spec in plain.processes)
    with open(tmp_path / "plain" / "g1-n2" / "node.yaml", encoding="utf-8") as handle:
        assert "peer_ha_addresses" not in yaml.safe_load(handle)


def test_toxiproxy_url_names_a_server_to_use_instead_of_running_one(tmp_path, monkeypatch):
    monkeypatch.setenv(TOXIPROXY_URL_ENV, "http://127.0.0.1:18474/")
    plan = plan_processes(str(tmp_path), small_topology(proxied=True), [])
    assert plan.proxies["api"] == "http://127.0.0.1:18474" and plan.proxies["external"]
    assert [spec.kind for spec in plan.processes] == ["node"] * 3
    assert not os.path.exists(tmp_path / "toxiproxy")


def test_proxied_must_be_true_or_false():
    with pytest.raises(ClusterError, match="proxied"):
        small_topology(proxied="yes")
    assert small_topology(proxied=True).proxied and not small_topology().proxied


def test_a_proxy_server_that_does_not_answer_is_a_cluster_error():
    from node.cluster.ports import free_ports
    port = free_ports("127.0.0.1", 1)[0]
    with pytest.raises(ClusterError, match="is it running"):
        ToxiproxyAPI(f"127.0.0.1:{port}", timeout_s=1).proxies()
    with pytest.raises(ClusterError, match="expected http"):
        ToxiproxyAPI("https://127.0.0.1:1")


def test_the_proxies_table_shows_state_toxics_and_an_unreachable_server():
    report = {"toxiproxy": "http://127.0.0.1:9", "proxies": [
        {"name": "client_to_g1-n1", "listen": "127.0.0.1:1", "upstream": "127.0.0.1:2", "present": True,
         "enabled": True, "toxics": []},
        {"name": "g1-n2_to_g1-n1_ha", "listen": "127.0.0.1:3", "upstream": "127.0.0.1:4", "present": True,
         "enabled": False, "toxics": [{"name": "lag", "type": "latency", "stream": "downstream",
                                      "attributes": {"latency": 200, "jitter": 0}}]},
        {"name": "g1-n1_to_zk", "listen": "127.0.0.1:5", "upstream": "127.0.0.1:6", "present": False,
         "enabled": False, "toxics": []}]}
    lines = render_proxies(report)
    assert lines[0] == "proxies (Toxiproxy http://127.0.0.1:9)"
    assert lines[1].split() == ["proxy", "listen", "upstream", "enabled", "toxics"]
    assert lines[2].split() == ["client_to_g1-n1", "127.0.0.1:1", "127.0.0.1:2", "yes", "-"]
    assert lines[3].split()[:5] == ["g1-n2_to_g1-n1_ha", "127.0.0.1:3", "127.0.0.1:4", "NO", "lag"]
    assert 'latency/downstream {"jitter": 0, "latency": 200}' in lines[3]
    assert lines[4].split()[3] == "missing"
    down = render_proxies({"toxiproxy": "http://127.0.0.1:9", "error": "refused", "proxies": [
        {"name": "client_to_g1-n1", "listen": "127.0.0.1:1", "upstream": "127.0.0.1:2", "kind": "client"}]})
    assert down[1] == "  proxy server: refused" and down[3].split()[3] == "?"
    assert render_proxies(None) == []
