"""The write permit's lease against a real ZooKeeper: a master whose process stood still
for longer than a lease (SIGSTOP past the session timeout) acks nothing, and serves no
read, until a fresh read of the master znode confirms its epoch, even while kazoo still
believes the session is CONNECTED (its threads stood still too).

The pause is made in-process: the test holds the agent's condition (the agent's worker
cannot start a renewal, as in a stopped process) and moves the agent's clock past the
lease. A real SIGSTOP of a node process is in tests/chaos/test_chaos_paused_master.py.
"""

from __future__ import annotations

import threading
import time

import pytest
from controller_fakes import SESSION_TIMEOUT_MS, Harness, wait_until

from controller import FencedError
from controller.agent import LEASE_FRACTION

pytestmark = pytest.mark.integration   # a real ZooKeeper


class JumpingClock:
    """time.monotonic plus a jump the test makes (what a stopped process sees on resume)."""

    def __init__(self) -> None:
        self.jump_s = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return time.monotonic() + self.jump_s

    def jump(self, seconds: float) -> None:
        with self._lock:
            self.jump_s += seconds


@pytest.fixture
def harness(zk_server, cluster):
    h = Harness(zk_server.hosts, cluster, SESSION_TIMEOUT_MS)
    yield h
    h.close()


def test_a_stall_past_the_lease_revokes_the_permit_until_zookeeper_confirms_it(harness):
    clock = JumpingClock()
    a = harness.node("a", max_offset=10, clock=clock)
    harness.controller()
    a.wait_for(lambda n: n.role == "master" and n.epoch == 1, 10, "master of epoch 1")
    wait_until(lambda: a.agent.may_ack(1), 5, "permit of epoch 1")
    assert a.write()
    lease_s = SESSION_TIMEOUT_MS / 1000 * LEASE_FRACTION
    with a.agent._cond:                        # the worker cannot renew: the process "stands still"
        clock.jump(lease_s + 0.1)              # ...for longer than a lease
        assert a.agent.client.state == "CONNECTED"   # kazoo has not noticed anything
        assert not a.agent.may_ack(1) and a.agent.write_permit() is None
        assert not a.write()
        with pytest.raises(FencedError, match="lease"):
            a.agent.check_write_permit(1)
    # resumed: the next renewal reads the master znode, which still names a in epoch 1
    wait_until(lambda: a.agent.may_ack(1), 5, "the permit back after a fresh read")
    assert a.write()


def test_a_master_renews_its_lease_while_it_runs(harness):
    a = harness.node("a", max_offset=10)
    harness.controller()
    a.wait_for(lambda n: n.role == "master" and n.epoch == 1, 10, "master of epoch 1")
    wait_until(lambda: a.agent.may_ack(1), 5, "permit of epoch 1")
    lease_s = SESSION_TIMEOUT_MS / 1000 * LEASE_FRACTION
    deadline = time.monotonic() + 3 * lease_s
    refused = 0
    while time.monotonic() < deadline:         # bounded: three leases
        refused += not a.agent.may_ack(1)
        time.sleep(0.01)
    assert refused == 0, "a running master's permit lapsed between renewals"
