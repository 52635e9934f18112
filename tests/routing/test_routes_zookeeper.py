"""Topic routes in a real ZooKeeper: written, read back, listed, grown, never shrunk."""

from __future__ import annotations

import pytest

from controller import layout
from controller.errors import RouteError
from controller.routes import list_routes, plan_route, read_route, write_route

pytestmark = pytest.mark.integration   # a real ZooKeeper server


def _groups(zk, cluster, *names):
    for name in names:
        zk.ensure_path(layout.nodes_path(cluster, name))


def test_create_read_list_and_grow_a_route(zk, cluster_name):
    _groups(zk, cluster_name, "g1", "g2")
    assert read_route(zk, cluster_name, "orders") is None
    route, old, version = plan_route(zk, cluster_name, "orders", 8, None)
    assert old is None and version is None
    assert route.as_mapping() == {"g1": (0, 1, 2, 3), "g2": (0, 1, 2, 3)}
    write_route(zk, cluster_name, route, version)
    assert read_route(zk, cluster_name, "orders") == route
    data, _ = zk.get(f"/hastore/{cluster_name}/topics/orders")
    assert b'"queues":[["g1",[0,1,2,3]],["g2",[0,1,2,3]]]' in data   # readable with zkCli.sh

    _groups(zk, cluster_name, "g3")
    grown, old, version = plan_route(zk, cluster_name, "orders", 12, None)
    assert old == route and grown.as_mapping() == {"g1": (0, 1, 2, 3), "g2": (0, 1, 2, 3), "g3": (0, 1, 2, 3)}
    write_route(zk, cluster_name, grown, version)
    with pytest.raises(RouteError, match="changed while"):
        write_route(zk, cluster_name, grown, version)          # a stale version loses
    with pytest.raises(RouteError, match="never shrinks"):
        plan_route(zk, cluster_name, "orders", 4, None)

    single, _, v = plan_route(zk, cluster_name, "audit", 2, ["g2"])
    write_route(zk, cluster_name, single, v)
    assert [(r.topic, r.as_mapping()) for r in list_routes(zk, cluster_name)] == [
        ("audit", {"g2": (0, 1)}), ("orders", grown.as_mapping())]


def test_a_group_zookeeper_does_not_know_is_refused(zk, cluster_name):
    _groups(zk, cluster_name, "g1")
    with pytest.raises(RouteError, match="no group g7"):
        plan_route(zk, cluster_name, "orders", 4, ["g1", "g7"])
