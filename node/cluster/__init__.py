"""Local clusters on loopback: the topology (cluster.yaml), the one process supervisor
(``LocalCluster``: ZooKeeper, controllers, nodes) and ``hastore cluster``.

    from node.cluster import LocalCluster
    cluster = LocalCluster("/tmp/c"); cluster.up(); cluster.kill("g1-n1"); cluster.down()
"""

from .supervisor import LocalCluster
from .topology import ClusterConfigError, ClusterError, ClusterTopology, default_topology

__all__ = ["LocalCluster", "ClusterConfigError", "ClusterError", "ClusterTopology", "default_topology"]
