"""Secrets are private: the files that hold one are mode 0600, a node takes it from a file or
the environment instead of its YAML, and no status, JSON output, metrics or log shows it."""

from __future__ import annotations

import json
import os
import stat
import urllib.request

import pytest

from node.cluster.state import write_state
from hostile_helpers import NodeProcess, run_hastore, write_config

pytestmark = pytest.mark.integration

SECRET = "TOPSECRET-hostile-4711"


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_cluster_state_is_private_even_over_an_old_file(tmp_path):
    path = tmp_path / "cluster.json"
    (tmp_path / "cluster.json.tmp").write_text("left behind")
    os.chmod(tmp_path / "cluster.json.tmp", 0o644)
    write_state(str(path), {"format": 1, "topology": {"secret": SECRET}})
    assert _mode(path) == 0o600


@pytest.mark.parametrize("source", ["secret_file", "environment"])
def test_a_node_takes_its_secret_from_a_file_or_the_environment_and_never_shows_it(tmp_path, source):
    env = {}
    if source == "secret_file":
        secret_path = tmp_path / "secret"
        secret_path.write_text(SECRET + "\n")
        os.chmod(secret_path, 0o600)
        config = write_config(tmp_path / "n", secret_file=str(secret_path))
    else:
        env = {"HASTORE_SECRET": SECRET}
        config = write_config(tmp_path / "n")
    assert SECRET not in config.read_text()
    node = NodeProcess(config, env=env)
    try:
        refused = run_hastore("status", "--bootstrap", node.client_address, env={"HASTORE_SECRET": ""})
        assert refused.returncode == 1 and "requires a secret" in refused.stderr
        status = run_hastore("status", "--bootstrap", node.client_address, "--json",
                             env={"HASTORE_SECRET": SECRET})
        assert status.returncode == 0, status.stderr
        text = run_hastore("status", "--bootstrap", node.client_address, env={"HASTORE_SECRET": SECRET})
        produced = run_hastore("produce", "--bootstrap", node.client_address, "--topic", "t", "--count", "3",
                               "--json", env={"HASTORE_SECRET": SECRET})
        assert json.loads(produced.stdout)["ok"] == 3
        metrics = urllib.request.urlopen(f"http://{node.ready['metrics_address']}/metrics", timeout=10).read()
        for shown in (status.stdout, status.stderr, text.stdout, produced.stdout, produced.stderr,
                      metrics.decode()):
            assert SECRET not in shown
    finally:
        node.stop()
    assert SECRET not in node.stderr()
