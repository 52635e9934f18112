"""A proxied local cluster: every link through a proxy of its own, partition and HA-link faults."""

from __future__ import annotations

import dataclasses
import json
import os

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

from conftest import DRILL_TOPOLOGY


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
    assert overrides == {"peer_ha_addresses": {"h:1": listen["g1-n2_to_g1-n1_ha"]}, "zk_hosts": listen["g1-n2_to_zk"]}
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
            found = {}
            for spec in controller_cluster.nodes("g1"):
                if spec.name != master:
                    async with open_admin(address_of(spec.name)) as admin:
                        found[spec.name] = (await admin.status())["replication"]["master_ha_address"]
            return found
        for slave, dialed in trio.run(slave_dials).items():
            assert dialed == listing[ha_proxy(slave, master)]["listen"]
        settings = RunSettings(nemesis="partition-master-slaves,partition-master-zk,ha-blackhole", cycles=3, seed=4,
                               hold_s=(1.0, 2.0), rest_s=(0.5, 1.0), time_limit_s=90.0,
                               load=LoadSettings(producers=2, send_interval_ms=10.0))
        report = run_chaos(controller_cluster, settings, proxies=proxies, address_of=address_of)
    verdict = report.verdict
    assert verdict.sends.valid and not verdict.dirty_reads and not verdict.divergence, verdict.to_json()
    assert report.caught_up and all(c.recovered for c in report.cycles), report.to_json()
    assert not os.path.exists(os.path.join(controller_cluster.directory, "chaos", "proxies.json"))


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
        cluster.kill("toxiproxy")   # a run on a cluster whose proxy server died says how to bring it back
        with pytest.raises(RunError, match="cluster restart toxiproxy"):
            with open_proxies(cluster):
                pass
    finally:
        cluster.down()
