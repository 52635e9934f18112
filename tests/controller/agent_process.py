"""A node agent in its own process, for kill -9 tests: ``python agent_process.py HOSTS CLUSTER GROUP
NODE_ID SESSION_TIMEOUT_MS SSS_MEMBERS``. Prints ``MASTER <epoch>`` once master and its
sync-state set is written (members comma-separated), then runs until killed."""

from __future__ import annotations

import sys
import threading
import time

from controller import AgentSettings, DeposedMasterError, FencedError, NodeAgent


class Node:
    def __init__(self) -> None:
        self.master_epoch = threading.Event()
        self.epoch = 0

    def node_info(self) -> dict:
        return {"client_address": "proc.test:10911", "ha_address": "", "max_offset": 10**6, "epoch": self.epoch,
                "priority": 0}

    def on_become_master(self, epoch: int) -> None:
        self.epoch = epoch
        self.master_epoch.set()

    def on_become_slave(self, epoch, master) -> None:
        self.epoch = epoch

    def on_fence(self, reason: str) -> None:
        pass


def main(hosts: str, cluster: str, group: str, node_id: str, session_timeout_ms: str, members: str) -> None:
    node = Node()
    agent = NodeAgent(AgentSettings(hosts, cluster, group, node_id, int(session_timeout_ms), 200), node)
    agent.start()
    if not node.master_epoch.wait(20):
        sys.exit("never became master")
    for _ in range(100):           # the other members register at their own pace
        try:
            agent.update_sync_state_set(members.split(","))
            break
        except (FencedError, DeposedMasterError):
            time.sleep(0.05)
    print(f"MASTER {node.epoch}", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    main(*sys.argv[1:])
