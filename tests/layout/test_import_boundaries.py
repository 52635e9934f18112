"""What each light module loads, measured in a fresh interpreter (sys.modules after the import).

The client library and the pure codec are imported by processes that run no node: the CLI's
client commands, Spark's Python workers, the chaos checkers. They must not drag in the
storage engine, numpy, the metrics server, the node server, replication or ZooKeeper.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration   # each case starts a fresh interpreter

CLIENT_MUST_NOT_LOAD = ("store.message_store", "numpy", "prometheus_client", "node.server", "replication",
                        "controller", "kazoo")


def loaded_after(statement: str, watched: tuple[str, ...]) -> list[str]:
    """The watched modules (or their submodules) present after ``statement`` in a new interpreter."""
    program = (f"import sys, json\n{statement}\n"
               f"watched = {list(watched)!r}\n"
               "print(json.dumps(sorted(w for w in watched if any(m == w or m.startswith(w + '.') "
               "for m in sys.modules))))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("statement", [
    "import node.client",
    "from node.client import SyncProducer, SyncConsumer, SyncAdmin",
    "from node.client import open_producer, open_consumer, open_admin, OutgoingMessage",
])
def test_the_client_library_loads_no_server_engine_or_zookeeper(statement):
    assert loaded_after(statement, CLIENT_MUST_NOT_LOAD) == []


def test_the_pure_codec_loads_neither_numpy_nor_the_engine():
    assert loaded_after("import store.codec, store.errors", ("numpy", "store.message_store", "store.commit_log")) == []


def test_the_wire_protocol_loads_no_server():
    assert loaded_after("import node.wire.protocol", ("node.server", "numpy", "store.message_store")) == []


def test_the_watch_list_is_not_vacuous():
    # the same probe sees the heavy modules where they belong
    assert loaded_after("import node.server.node", ("numpy", "store.message_store", "prometheus_client")) == [
        "numpy", "prometheus_client", "store.message_store"]
