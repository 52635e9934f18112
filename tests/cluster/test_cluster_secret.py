"""A local cluster's secret kept out of cluster.yaml, cluster.json and node.yaml: from a
secret_file (mode 0600) or HASTORE_SECRET, and never printed by status, logs or JSON."""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml

from node.cluster.cli import LocalCluster
from node.cluster.cluster_secret import with_secret_from_environment
from node.cluster.plan import plan_processes
from node.cluster.topology import ClusterConfigError, load_topology, topology_from_mapping
from node.errors import NodeError

from cluster_helpers import SMALL_STORE, hastore, node_status, small_topology

SECRET = "s3cret-that-must-not-show"


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _secret_file(path, mode: int = 0o600):
    path.write_text(SECRET + "\n")
    os.chmod(path, mode)
    return path


def test_a_secret_file_is_read_relative_to_cluster_yaml_and_named_in_each_node_yaml(tmp_path):
    _secret_file(tmp_path / "cluster.secret")
    (tmp_path / "cluster.yaml").write_text("secret_file: cluster.secret\ncontroller: {mode: static}\n")
    topology = load_topology(str(tmp_path / "cluster.yaml"))
    assert topology.secret == SECRET and topology.secret_file == str(tmp_path / "cluster.secret")
    assert topology.source["secret_file"] == str(tmp_path / "cluster.secret")
    assert SECRET not in repr(topology)
    plan_processes(str(tmp_path / "c"), topology, [])
    text = (tmp_path / "c" / "g1-n1" / "node.yaml").read_text()
    assert SECRET not in text and yaml.safe_load(text)["secret_file"] == str(tmp_path / "cluster.secret")


def test_a_secret_file_others_may_read_or_a_second_source_is_refused(tmp_path):
    loose = _secret_file(tmp_path / "loose", 0o644)
    with pytest.raises(ClusterConfigError, match="chmod 600"):
        topology_from_mapping({"secret_file": str(loose)})
    with pytest.raises(ClusterConfigError, match="not both"):
        topology_from_mapping({"secret_file": str(_secret_file(tmp_path / "tight")), "secret": "x"})
    with pytest.raises(ClusterConfigError, match="cannot read"):
        topology_from_mapping({"secret_file": str(tmp_path / "absent")})


def test_hastore_secret_is_kept_in_a_private_file_the_topology_names(tmp_path):
    directory = str(tmp_path / "c")
    os.makedirs(directory)
    topology = with_secret_from_environment(small_topology(), directory, {"HASTORE_SECRET": SECRET})
    kept = os.path.join(directory, "secret")
    assert topology.secret == SECRET and topology.secret_file == kept and _mode(kept) == 0o600
    assert "secret" not in topology.source and topology_from_mapping(topology.source).secret == SECRET
    rotated = with_secret_from_environment(topology, directory, {"HASTORE_SECRET": "another"})
    assert rotated.secret == "another" and open(kept).read() == "another\n"
    assert with_secret_from_environment(topology, directory, {}) is topology
    in_yaml = small_topology(secret="from-yaml")
    assert with_secret_from_environment(in_yaml, directory, {"HASTORE_SECRET": SECRET}) is in_yaml
    with pytest.raises(ClusterConfigError, match="one line"):
        with_secret_from_environment(small_topology(), directory, {"HASTORE_SECRET": "a\nb"})


def _files_holding(directory: str, text: str) -> list[str]:
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                if text.encode() in handle.read():
                    found.append(os.path.relpath(path, directory))
    return sorted(found)


@pytest.mark.integration
@pytest.mark.parametrize("source", ["environment", "secret_file"])
def test_a_cluster_with_its_secret_out_of_the_yaml_never_shows_it(cluster_dir, tmp_path, source):
    config = {"cluster": "private", "nodes_per_group": 2, "controller": {"mode": "static"}, "store": SMALL_STORE}
    env = {key: value for key, value in os.environ.items() if key != "HASTORE_SECRET"}
    if source == "environment":
        env["HASTORE_SECRET"] = SECRET
    else:
        config["secret_file"] = str(_secret_file(tmp_path / "cluster.secret"))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(config))
    up = hastore("cluster", "up", "--dir", cluster_dir, "--config", str(tmp_path / "cluster.yaml"), "--json", env=env)
    assert up.returncode == 0, up.stderr
    # later commands run without the variable: the cluster finds its secret in its files
    bare = {key: value for key, value in os.environ.items() if key != "HASTORE_SECRET"}
    outputs = [up.stdout, up.stderr]
    for args in (("cluster", "status", "--dir", cluster_dir), ("cluster", "status", "--dir", cluster_dir, "--json"),
                 ("cluster", "logs", "g1-n1", "--dir", cluster_dir),
                 ("produce", "--dir", cluster_dir, "--topic", "t", "--count", "3", "--json")):
        done = hastore(*args, env=bare)
        assert done.returncode == 0, (args, done.stderr)
        outputs += [done.stdout, done.stderr]
    status = json.loads(outputs[4])
    assert [node["state"] for node in status["groups"]["g1"]] == ["up", "up"]
    assert not any(SECRET in text for text in outputs)
    # only files of mode 0600 hold it: DIR/secret when it came from the environment, else none
    holders = _files_holding(cluster_dir, SECRET)
    assert holders == (["secret"] if source == "environment" else [])
    assert all(_mode(os.path.join(cluster_dir, path)) == 0o600 for path in holders)
    assert _mode(os.path.join(cluster_dir, "cluster.json")) == 0o600
    assert _mode(os.path.join(cluster_dir, "g1-n1", "node.yaml")) == 0o600
    # the nodes do require it: a client without it is refused, with it served
    address = LocalCluster(cluster_dir).node("g1-n1").client_address
    with pytest.raises(NodeError):
        node_status(address)
    assert node_status(address, SECRET)["node_id"] == "g1-n1"
