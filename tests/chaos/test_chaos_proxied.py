"""A proxied local cluster: every link through a proxy of its own, partition and HA-link faults."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import trio

from chaos import nemesis
from chaos.nemesis import ha_proxy
from chaos.errors import RunError
from chaos.proxied_cluster import node_overrides, open_proxies, plan_proxies
from chaos.run import RunSettings, run_chaos
from chaos.workload import LoadSettings
from node.client import open_admin
from node.cluster import LocalCluster, proxies, topology_from_mapping
from node.errors import NodeConfigError
from node.server.config import config_from_mapping

from chaos_helpers import DRILL_TOPOLOGY


def test_the_plan_names_a_proxy_per_link_and_routes_each_node_through_its_own():
    nodes = [("g1-n1", "g1", "c:1", "h:1"), ("g1-n2", "g1", "c:2", "h:2"), ("g2-n1", "g2", "c:3", "h:3")]
    links = plan_proxies(nodes, "z:1", ["controller-1"])
    names = {link.name: link for link in links}
    assert set(names) == {"client_to_g1-n1", "client_to_g1-n2", "client_to_g2-n1", "g1-n1_to_g1-n2_ha",
                          "g1-n2_to_g1-n1_ha", "g1-n1_to_zk", "g1-n2_to_zk", "g2-n1_to_zk", "controller-1_to_zk"}
    assert names["g1-n2_to_g1-n1_ha"].upstream == "h:1" and names["client_to_g2-n1"].upstream == "c:3"
    listen = {link.name: f"p:{index}" for index, link in enumerate(links)}
    links = tuple(dataclasses.replace(link, listen=listen[link.name]) for link in links)
    overrides = node_overrides("g1-n2", links, {"g1-n1": "h:1", "g1-n2": "h:2", "g2-n1": "h:3"})
    assert overrides == {"peer_ha_addresses": {"h:1": listen["g1-n2_to_g1-n1_ha"]}, "zk_hosts": listen["g1-n2_to_zk"],
                         "advertised_client_address": listen["client_to_g1-n2"]}
    # a static slave (no ZooKeeper) also tells clients its master's client proxy, not the master itself
    static = tuple(link for link in links if link.kind != "zk")
    assert node_overrides("g1-n2", static, {"g1-n1": "h:1", "g1-n2": "h:2"}, master_client_address="c:1") == {
        "peer_ha_addresses": {"h:1": listen["g1-n2_to_g1-n1_ha"]},
        "advertised_client_address": listen["client_to_g1-n2"], "master_client_address": listen["client_to_g1-n1"]}
    assert plan_proxies(nodes, None, []) == tuple(dataclasses.replace(l, listen=None) for l in links if l.kind != "zk")


def test_the_cluster_names_its_proxies_as_the_nemeses_cut_them():
    assert (proxies.client_proxy("g1-n1"), proxies.ha_proxy("g1-n3", "g1-n2"), proxies.zk_proxy("controller-1")) == (
        nemesis.client_proxy("g1-n1"), nemesis.ha_proxy("g1-n3", "g1-n2"), nemesis.zk_proxy("controller-1")) == (
        "client_to_g1-n1", "g1-n3_to_g1-n2_ha", "controller-1_to_zk")


def test_node_config_takes_peer_ha_addresses_and_checks_them():
    config = config_from_mapping({"peer_ha_addresses": {"127.0.0.1:1": "127.0.0.1:2"}})
    assert config.peer_ha_addresses == {"127.0.0.1:1": "127.0.0.1:2"}
    with pytest.raises(NodeConfigError, match="peer_ha_addresses"):
        config_from_mapping({"peer_ha_addresses": {"127.0.0.1:1": "nowhere"}})


@pytest.mark.integration
def test_a_proxied_cluster_replicates_through_its_pair_proxies_and_survives_partitions(controller_cluster):
    with open_proxies(controller_cluster) as (proxies, address_of):
        with open(os.path.join(controller_cluster.directory, "chaos", "proxies.json"), encoding="utf-8") as handle:
            listing = {p["name"]: p for p in json.load(handle)["proxies"]}
        master = controller_cluster.current_master("g1").node_id

        async def slave_dials():
            found, advertised = {}, {}
            with trio.fail_after(20):
                for spec in controller_cluster.nodes("g1"):
                    async with open_admin(address_of(spec.name)) as admin:
                        status = await admin.status()
                    advertised[spec.name] = status["advertised_client_address"]
                    if spec.name != master:
                        found[spec.name] = status["replication"]["master_ha_address"]
            return found, advertised
        dials, advertised = trio.run(slave_dials)
        for slave, dialed in dials.items():
            assert dialed == listing[ha_proxy(slave, master)]["listen"]
        # each node tells clients its client proxy (NOT_MASTER replies, ZooKeeper's master record)
        assert advertised == {spec.name: listing[f"client_to_{spec.name}"]["listen"]
                              for spec in controller_cluster.nodes("g1")}
        assert controller_cluster.current_master("g1").client_address == address_of(master)
        settings = RunSettings(nemesis="partition-master-slaves,partition-master-zk,ha-blackhole", cycles=3, seed=4,
                               hold_s=(1.0, 2.0), rest_s=(0.5, 1.0), time_limit_s=90.0,
                               load=LoadSettings(producers=2, send_interval_ms=10.0))
        report = run_chaos(controller_cluster, settings, proxies=proxies, address_of=address_of)
    verdict = report.verdict
    assert verdict.sends.valid and not verdict.dirty_reads and not verdict.divergence, verdict.to_json()
    assert report.caught_up and all(c.recovered for c in report.cycles), report.to_json()
    assert not os.path.exists(os.path.join(controller_cluster.directory, "chaos", "proxies.json"))
    # node.yaml restored: the master record names a node's own client address again
    master = controller_cluster.wait_for_master("g1", 30)
    assert master.client_address == controller_cluster.node(master.node_id).client_address


@pytest.mark.integration
def test_a_chaos_run_on_a_cluster_started_proxied_uses_its_lasting_proxies(tmp_path, monkeypatch):
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    cluster = LocalCluster(str(tmp_path / "cluster"), topology_from_mapping({**DRILL_TOPOLOGY, "proxied": True}))
    try:
        cluster.up()
        pids = {spec.name: cluster.pid(spec.name) for spec in cluster.specs}
        listen = {link.name: link.listen for link in cluster.proxy_links()}
        with open_proxies(cluster) as (proxies, address_of):
            assert proxies.url == cluster.proxy_api_url
            assert {node: address_of(node) for node in ("g1-n1", "g1-n2", "g1-n3")} == {
                node: listen[f"client_to_{node}"] for node in ("g1-n1", "g1-n2", "g1-n3")}
            assert {spec.name: cluster.pid(spec.name) for spec in cluster.specs} == pids   # nothing restarted
            settings = RunSettings(nemesis="partition-master-clients,partition-slave,ha-latency", cycles=3, seed=7,
                                   hold_s=(1.0, 2.0), rest_s=(0.5, 1.0), time_limit_s=90.0,
                                   load=LoadSettings(producers=2, send_interval_ms=10.0))
            report = run_chaos(cluster, settings, proxies=proxies, address_of=address_of)
        verdict = report.verdict
        assert verdict.sends.valid and not verdict.dirty_reads and not verdict.divergence, verdict.to_json()
        assert report.caught_up and all(c.recovered for c in report.cycles), report.to_json()
        assert report.summary()["acked"] > 0
        # the proxies outlive the run, healed, and the cluster still uses them
        listing = cluster.proxy_listing()
        assert {proxy["name"] for proxy in listing} == set(listen)
        assert all(proxy["enabled"] and not proxy["toxics"] for proxy in listing)
        assert not os.path.exists(os.path.join(cluster.directory, "chaos", "proxies.json"))
        # without --proxied, a run on a cluster started proxied uses its proxies: a partition is allowed
        result = _chaos_run(cluster.directory, "--nemesis", "partition-slave", "--seed", "3")
        report = json.loads(result.stdout)
        assert result.returncode == 0, result.stderr
        assert report["summary"]["cycles_run"] == 1 and report["cycles"][0]["kind"] == "partition-slave"
        assert {spec.name: cluster.pid(spec.name) for spec in cluster.specs} == pids   # nothing restarted
        cluster.kill("toxiproxy")   # a run on a cluster whose proxy server died says how to bring it back
        with pytest.raises(RunError, match="cluster restart toxiproxy"):
            with open_proxies(cluster):
                pass
    finally:
        cluster.down()


@pytest.mark.integration
def test_chaos_run_up_proxied_starts_a_lasting_proxied_cluster_and_stops_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    directory = str(tmp_path / "cluster")
    try:
        result = _chaos_run(directory, "--up", "--proxied", "--nemesis", "partition-master-clients", "--seed", "5")
        report = json.loads(result.stdout)
        assert result.returncode == 0, result.stderr
        assert report["summary"]["cycles_run"] == 1 and report["cycles"][0]["kind"] == "partition-master-clients"
        cluster = LocalCluster(directory)
        # started as `cluster up --proxied`: the proxy server ran as one of its processes, every link
        # had a proxy, and the nodes advertised their client proxies; all stopped after the run
        assert cluster.proxied and cluster.topology.proxied
        assert os.path.exists(os.path.join(directory, "toxiproxy", "toxiproxy.log"))
        assert {link.kind for link in cluster.proxy_links()} == {"client", "ha", "zk"}
        for spec in cluster.nodes():
            assert cluster.advertised_client_address(spec.name) != spec.client_address
        assert not cluster.running()
    finally:
        LocalCluster(directory).down()


def _chaos_run(directory: str, *options: str) -> subprocess.CompletedProcess:
    """``hastore chaos run`` of one short cycle (JSON), bounded."""
    command = [sys.executable, "-m", "node.cli", "chaos", "run", "--dir", directory, "--cycles", "1",
               "--time-limit", "60", "--producers", "2", "--json", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=240)
