"""A node process runs hastore's own code whatever directory it is started from: children
are started with ``python -P``, so the caller's working directory is not on their sys.path
(``-m`` alone puts it first, and a ``node`` package there would run instead)."""

from __future__ import annotations

import pytest

from node.cluster.process import NodeProcess

pytestmark = pytest.mark.integration   # a node process


def test_a_node_started_beside_another_node_package_runs_hastores(tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "node").mkdir(parents=True)
    (work / "node" / "__init__.py").write_text("raise SystemExit('the node package of the working directory ran')\n")
    monkeypatch.chdir(work)
    node = NodeProcess.start(str(tmp_path / "n1"))
    try:
        assert node.pid > 0 and node.client_address.startswith("127.0.0.1:")
    finally:
        node.stop()
