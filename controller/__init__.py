"""hastore's controller package: ZooKeeper-backed master election and the node-side agent.

- ``Controller`` / ``ControllerSettings``: the controller process logic (one active per cluster).
- ``NodeAgent`` / ``AgentSettings`` / ``AgentNode``: what a node embeds to register, follow
  role assignments and fence its writes.
- ``decide`` / ``GroupView`` / ``Decision``: the pure election rule.
- ``find_master``: the current master of a group, for clients and commands (``--zk``).
- ``ZooKeeperServer``: a local standalone ZooKeeper (tests, ``hastore cluster up``).
- ``layout``: znode paths and the JSON values they hold.
- ``routes``: topic routes (a topic's queues per group) in ``/hastore/{cluster}/topics/{topic}``.
"""

from . import layout, routes
from .agent import AgentNode, AgentSettings, AgentStatistics, NodeAgent
from .controller import Controller, ControllerSettings, ControllerStatistics
from .election import Decision, GroupView, Outcome, decide, master_is_alive, rank
from .errors import (ControllerError, DeposedMasterError, FencedError, NoMasterError, RouteError,
                     ZnodeValueError, ZooKeeperServerError, ZooKeeperUnavailableError)
from .faults import expire_session
from .layout import GroupStatus, MasterRecord, NodeRecord, SyncStateSet
from .znodes import GroupSnapshot, find_master, find_master_with_client, make_client, read_group
from .zookeeper_server import ZooKeeperServer

__all__ = [
    "AgentNode", "AgentSettings", "AgentStatistics", "NodeAgent",
    "Controller", "ControllerSettings", "ControllerStatistics",
    "Decision", "GroupView", "Outcome", "decide", "master_is_alive", "rank",
    "ControllerError", "DeposedMasterError", "FencedError", "NoMasterError", "RouteError",
    "ZnodeValueError", "ZooKeeperServerError", "ZooKeeperUnavailableError",
    "expire_session", "GroupStatus", "MasterRecord", "NodeRecord", "SyncStateSet",
    "GroupSnapshot", "find_master", "find_master_with_client", "make_client", "read_group",
    "ZooKeeperServer", "layout", "routes",
]
