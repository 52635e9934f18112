"""The routing client keeps the client library light: importing it loads no kazoo and no
controller (ZooKeeperDirectory loads them on first use)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration   # a fresh interpreter per case


@pytest.mark.parametrize("statement", [
    "import node.client",
    "from node.client.routing import RoutedProducer, ZooKeeperDirectory, NodeDirectory",
    "from node.client.routed_consumer import RoutedConsumer; from node.client import ZooKeeperDirectory as Z; "
    "Z('127.0.0.1:1')",
])
def test_routing_loads_no_kazoo_until_zookeeper_is_used(statement):
    program = (f"import sys, json\n{statement}\n"
               "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('kazoo', 'controller'))))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
