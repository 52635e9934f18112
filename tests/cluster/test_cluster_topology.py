"""cluster.yaml: defaults, refusals with the key named, ports, and the status rendering."""

from __future__ import annotations

import socket

import pytest

from node.cluster.cli import ClusterConfigError, default_topology, load_topology, topology_from_mapping
from node.cluster.cli import render_replication
from node.cluster.topology import ClusterError, LOCAL_STORE_DEFAULTS, NodePorts, assign_ports
from node.server.config import config_from_mapping


def test_the_default_topology_is_one_group_of_three_nodes_under_a_controller():
    topology = default_topology()
    assert topology.controller.enabled and topology.controller.controllers == 2
    assert topology.controller.session_timeout_ms == 2000 and topology.controller.zookeeper_tick_ms == 250
    ports = assign_ports(topology, {})
    mappings = [topology.node_config(node, ports, "/tmp/x", zk_hosts="127.0.0.1:2181") for node in topology.nodes]
    assert [(m["node_id"], m["zk_hosts"], m["priority"], m["zk_session_timeout_ms"]) for m in mappings] == [
        ("g1-n1", "127.0.0.1:2181", 0, 2000), ("g1-n2", "127.0.0.1:2181", 1, 2000),
        ("g1-n3", "127.0.0.1:2181", 2, 2000)]
    assert not any(key in m for m in mappings for key in ("role", "master_ha_address", "master_client_address"))
    with pytest.raises(ClusterError, match="zk_hosts"):
        topology.node_config(topology.node("g1-n1"), ports, "/tmp/x")


def test_static_mode_is_one_group_of_a_master_and_two_slaves():
    topology = topology_from_mapping({"controller": {"mode": "static"}})
    assert [(n.node_id, n.group, n.role) for n in topology.nodes] == [
        ("g1-n1", "g1", "master"), ("g1-n2", "g1", "slave"), ("g1-n3", "g1", "slave")]
    ports = assign_ports(topology, {})
    assert len({p for ports_ in ports.values() for p in ports_.as_list()}) == 9
    slave = config_from_mapping(topology.node_config(topology.node("g1-n2"), ports, "/tmp/x"))
    assert slave.role == "slave" and slave.replication == "sync" and slave.cluster == "hastore"
    assert slave.master_ha_address == f"127.0.0.1:{ports['g1-n1'].ha_port}"
    assert slave.master_client_address == f"127.0.0.1:{ports['g1-n1'].client_port}"
    assert slave.store["commitlog_segment_bytes"] == LOCAL_STORE_DEFAULTS["commitlog_segment_bytes"]


def test_groups_masters_overrides_and_base_ports():
    topology = topology_from_mapping({
        "cluster": "demo", "base_port": 30000, "replication": "async", "secret": "s3cret",
        "controller": {"mode": "static"},
        "groups": {"a": {"nodes": 2}, "b": {"nodes": ["x", "y", "z"], "master": "y", "replication": "sync",
                                            "store": {"flush_interval_ms": 100}}},
        "nodes": {"z": {"flush": "sync", "client_port": 31000, "ha_port": 31001, "metrics_port": 31002,
                        "store": {"check_crc_on_read": False}}}})
    assert [(n.node_id, n.group, n.role) for n in topology.nodes] == [
        ("a-n1", "a", "master"), ("a-n2", "a", "slave"), ("x", "b", "slave"), ("y", "b", "master"),
        ("z", "b", "slave")]
    assert topology.node("a-n2").fixed_ports == NodePorts(30003, 30004, 30005)
    assert topology.node("z").fixed_ports == NodePorts(31000, 31001, 31002)
    ports = {n.node_id: n.fixed_ports for n in topology.nodes}
    z = config_from_mapping(topology.node_config(topology.node("z"), ports, "/tmp/z"))
    assert (z.flush, z.replication, z.secret, z.cluster) == ("sync", "sync", "s3cret", "demo")
    assert z.master_ha_address == "127.0.0.1:30010"  # y is node index 3: 30000 + 9 + 1
    assert z.store["flush_interval_ms"] == 100 and z.store["check_crc_on_read"] is False
    assert config_from_mapping(topology.node_config(topology.node("a-n2"), ports, "/t")).replication == "async"


@pytest.mark.parametrize("mapping, named", [
    ({"clusterr": "x"}, "clusterr: unknown key"),
    ({"groups": {"g1": {"replicas": 2}}}, "groups.g1.replicas: unknown key"),
    ({"groups": {"g1": {"master": "n9"}}}, "groups.g1.master"),
    ({"groups": {"g1": {"nodes": 0}}}, "groups.g1.nodes"),
    ({"groups": {}}, "groups: at least one group"),
    ({"groups": {"g1": {}, "g2": {"nodes": ["g1-n1"]}}}, "repeated: g1-n1"),
    ({"nodes": {"g1-n9": {}}}, "nodes.g1-n9: no such node"),
    ({"nodes": {"g1-n2": {"role": "master"}}}, "nodes.g1-n2.role: set by the cluster"),
    ({"nodes": {"g1-n2": {"zk_hosts": "x"}}}, "nodes.g1-n2.zk_hosts: set by the cluster"),
    ({"controller": {"mode": "raft"}}, "controller.mode: must be 'controller' or 'static'"),
    ({"controller": {"sesion_timeout_ms": 1}}, "controller.sesion_timeout_ms: unknown key"),
    ({"controller": {"session_timeout_ms": 400}}, "controller.session_timeout_ms: must be an integer between 500"),
    ({"controller": {"zookeeper": {"tick_ms": 100}, "session_timeout_ms": 2500}},
     "controller.session_timeout_ms: must be an integer between 200 and 2000"),
    ({"controller": {"controllers": 0}}, "controller.controllers: must be an integer between 1"),
    ({"controller": {"zookeeper": {"host": "x"}}}, "controller.zookeeper.host: unknown key"),
    ({"nodes": {"g1-n2": {"client_port": 20000}}}, "nodes.g1-n2: give all of"),
    ({"nodes": {"g1-n2": {"connections_maxx": 3}}}, "connections_maxx: unknown key"),
    ({"nodes": {"g1-n2": {"connections_max": 0}}}, "connections_max: must be between"),
    ({"store": {"commitlog_segment_bytes": 12}}, "commitlog_segment_bytes"),
    ({"store": {"flush": "sync"}}, "store.flush"),
    ({"replication": "semi"}, "replication: must be 'sync' or 'async'"),
    ({"host": "0.0.0.0"}, "host: a local cluster listens on an IPv4 loopback"),
    ({"host": "10.0.0.1"}, "host:"),
    ({"base_port": 65534}, "base_port"),
    ({"secret": ""}, "secret"),
    ({"startup_timeout_s": 0}, "startup_timeout_s"),
    ([1, 2], "must be a mapping"),
])
def test_bad_cluster_configs_are_refused_with_the_key_named(mapping, named):
    with pytest.raises(ClusterConfigError) as caught:
        topology_from_mapping(mapping)
    assert named in str(caught.value)


def test_load_topology_names_the_file(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("groups: {g1: {nodez: 2}}\n")
    with pytest.raises(ClusterConfigError, match=r"cluster.yaml: groups.g1.nodez: unknown key"):
        load_topology(str(path))
    path.write_text("groups: [\n")
    with pytest.raises(ClusterConfigError, match="not valid YAML"):
        load_topology(str(path))
    path.write_text("")
    assert [n.node_id for n in load_topology(str(path)).nodes] == ["g1-n1", "g1-n2", "g1-n3"]


def test_a_taken_fixed_port_is_refused_before_anything_starts():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        topology = topology_from_mapping({"groups": {"g1": {"nodes": 1}},
                                          "nodes": {"g1-n1": {"client_port": port, "ha_port": port + 1,
                                                              "metrics_port": port + 2}}})
        with pytest.raises(ClusterError, match=f"port\\(s\\) {port}"):
            assign_ports(topology, {})


def test_previous_ports_are_reused_only_while_free():
    topology = default_topology()
    first = assign_ports(topology, {})
    assert assign_ports(topology, first) == first
    with socket.socket() as holder:
        # a listener, as a node's: SO_REUSEADDR lets it take a port still in TIME_WAIT
        # from an earlier test, which assign_ports counts free
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", first["g1-n2"].client_port))
        holder.listen()
        second = assign_ports(topology, first)
    assert second["g1-n1"] == first["g1-n1"] and second["g1-n3"] == first["g1-n3"]
    assert second["g1-n2"] != first["g1-n2"]


def test_replication_sections_render_whatever_keys_they_have():
    lines = render_replication({
        "mode": "sync", "confirm_offset": 4096, "sync_state_set": ["g1-n1", "g1-n2"],
        "slaves": {"g1-n2": {"ack_offset": 4096, "lag_bytes": 0}, "g1-n3": {"ack_offset": 1024, "lag_bytes": 3072,
                                                                          "lag_ms": 250}}})
    assert lines[0] == "sync_state_set: [g1-n1, g1-n2]  confirm_offset: 4096  mode: sync"
    table = lines[lines.index("slaves:") + 1:]
    assert table[0].split() == ["ack_offset", "lag_bytes", "lag_ms"]
    assert table[1].split() == ["g1-n2", "4096", "0", "-"]
    assert table[2].split() == ["g1-n3", "1024", "3072", "250"]
    long = render_replication({f"key{i}": "x" * 30 for i in range(6)}, width=80)
    assert len(long) == 3 and all(len(line) <= 80 for line in long)
    as_list = render_replication({"slaves": [{"node_id": "g1-n2", "lag_bytes": 7}]})
    assert as_list[1].split() == ["node_id", "lag_bytes"] and as_list[2].split() == ["g1-n2", "7"]


def test_the_status_table_shows_down_and_unresponsive_nodes_and_replication():
    from node.cluster.cli import ProcessSpec, ProcessStatus, render_status

    def spec(name, role):
        return ProcessSpec(name=name, kind="node", phase=0, argv=("hastore",), config_path="c", log_path="l",
                           data_path="d", group="g1", role=role, client_address=f"127.0.0.1:{len(name)}")
    up = {"role": "master", "epoch": 3, "store": {"max_physical_offset": 777},
          "replication": {"confirm_offset": 700, "sync_state_set": ["m", "s1"]}}
    lines = render_status([ProcessStatus(spec("m", "master"), "up", 11, up, None),
                           ProcessStatus(spec("s1", "slave"), "down", None, None, None),
                           ProcessStatus(spec("s2", "slave"), "unresponsive", 12, None, "TooSlowError")])
    assert lines[0] == "group g1"
    rows = [line.split() for line in lines[2:5]]
    assert rows[0] == ["m", "up", "master", "3", "127.0.0.1:1", "777", "0", "11"]
    assert rows[1] == ["s1", "down", "(slave)", "-", "127.0.0.1:2", "-", "-", "-"]
    assert rows[2][:3] == ["s2", "unresponsive", "(slave)"]
    assert "  s2: TooSlowError" in lines
    assert "  replication (m):" in lines
    assert "    sync_state_set: [m, s1]  confirm_offset: 700" in lines
