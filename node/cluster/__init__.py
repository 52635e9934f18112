"""Local clusters on loopback: the topology (cluster.yaml), ``LocalCluster`` (ZooKeeper,
controllers and nodes as processes, and their records in ZooKeeper) and ``hastore cluster``.

    from node.cluster import LocalCluster
    cluster = LocalCluster("/tmp/c"); cluster.up(); cluster.kill("g1-n1"); cluster.down()

A single node as a child process (demo, benchmarks, tests) is ``node.cluster.process.NodeProcess``;
both run their processes through the one supervisor in processes.py.
"""

from .records import ClusterRecords, GroupRecords
from .supervisor import ClusterStartError, LocalCluster, StopReport
from .topology import ClusterConfigError, ClusterError, ClusterTopology, default_topology, topology_from_mapping

__all__ = ["LocalCluster", "ClusterStartError", "StopReport", "ClusterRecords", "GroupRecords",
           "ClusterConfigError", "ClusterError", "ClusterTopology", "default_topology", "topology_from_mapping"]
